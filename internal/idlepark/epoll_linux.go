//go:build linux

package idlepark

import (
	"sync"
	"syscall"
)

// poller is an epoll set. Each socket is added one-shot, so it reports
// once and is then removed; a pipe wakes the goroutine for Close.
type poller struct {
	epfd int
	wake [2]int // pipe: Close writes to wake[1]
	// hangupsOnly: sockets are added for the peer's hang-up alone
	// (NewHangups), not for bytes to read.
	hangupsOnly bool

	// fdmu keeps the descriptors open while add or remove use them, so
	// that the goroutine's exit cannot close them under a late Park (and
	// an unrelated file reuse the numbers).
	fdmu   sync.RWMutex
	closed bool
}

func (p *poller) open() error {
	epfd, err := syscall.EpollCreate1(syscall.EPOLL_CLOEXEC)
	if err != nil {
		return err
	}
	if err := syscall.Pipe2(p.wake[:], syscall.O_CLOEXEC|syscall.O_NONBLOCK); err != nil {
		syscall.Close(epfd)
		return err
	}
	p.epfd = epfd
	ev := syscall.EpollEvent{Events: syscall.EPOLLIN}
	setToken(&ev, wakeToken)
	if err := syscall.EpollCtl(epfd, syscall.EPOLL_CTL_ADD, p.wake[0], &ev); err != nil {
		p.closeFDs()
		return err
	}
	return nil
}

func setToken(ev *syscall.EpollEvent, token uint64) {
	ev.Fd = int32(uint32(token))
	ev.Pad = int32(uint32(token >> 32))
}

func tokenOf(ev *syscall.EpollEvent) uint64 {
	return uint64(uint32(ev.Fd)) | uint64(uint32(ev.Pad))<<32
}

// add registers fd for readability and hang-up, reported once. Level
// triggered: bytes already queued when it is added are reported at once.
func (p *poller) add(fd uintptr, token uint64) error {
	ev := syscall.EpollEvent{Events: syscall.EPOLLIN | syscall.EPOLLRDHUP | syscall.EPOLLONESHOT}
	if p.hangupsOnly {
		// EPOLLHUP and EPOLLERR (a reset) are reported whatever the mask.
		ev.Events = syscall.EPOLLRDHUP | syscall.EPOLLONESHOT
	}
	setToken(&ev, token)
	p.fdmu.RLock()
	defer p.fdmu.RUnlock()
	if p.closed {
		return ErrClosed
	}
	return syscall.EpollCtl(p.epfd, syscall.EPOLL_CTL_ADD, int(fd), &ev)
}

func (p *poller) remove(fd uintptr) {
	p.fdmu.RLock()
	defer p.fdmu.RUnlock()
	if !p.closed {
		syscall.EpollCtl(p.epfd, syscall.EPOLL_CTL_DEL, int(fd), nil)
	}
}

// run waits in epoll_wait, a blocking system call: one thread sits in it,
// which is the price of not holding a goroutine per connection.
func (p *poller) run(ready func(token uint64)) {
	defer p.closeFDs()
	events := make([]syscall.EpollEvent, 256)
	for {
		n, err := syscall.EpollWait(p.epfd, events, -1)
		if err != nil {
			if err == syscall.EINTR {
				continue
			}
			return // EBADF/EINVAL: nothing to recover
		}
		for i := range events[:n] {
			token := tokenOf(&events[i])
			if token == wakeToken {
				return
			}
			ready(token)
		}
	}
}

func (p *poller) close() {
	syscall.Write(p.wake[1], []byte{1})
}

func (p *poller) closeFDs() {
	p.fdmu.Lock()
	defer p.fdmu.Unlock()
	p.closed = true
	syscall.Close(p.wake[0])
	syscall.Close(p.wake[1])
	syscall.Close(p.epfd)
}

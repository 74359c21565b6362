//go:build !linux

package idlepark

// poller is absent: New fails with ErrUnsupported and nothing parks.
type poller struct{ hangupsOnly bool }

func (p *poller) open() error                        { return ErrUnsupported }
func (p *poller) add(fd uintptr, token uint64) error { return ErrUnsupported }
func (p *poller) remove(fd uintptr)                  {}
func (p *poller) run(func(uint64))                   {}
func (p *poller) close()                             {}

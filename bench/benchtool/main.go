// Command benchtool is the measuring half of bench/run.sh: the shell script
// orchestrates processes, this program does what bash cannot do precisely.
//
//	benchtool freeport [N]                 print N free loopback TCP ports
//	benchtool measure [-pid NAME=PID]... -out FILE -- CMD ARGS...
//	benchtool idle -addr HOST:PORT -pid PID -conns N [flags]
//	benchtool mixed -tests get,set -- redis-benchmark ARGS...
//
// measure runs CMD, writes its stdout to FILE, and prints one line on stdout
//
//	wall_us=W client_us=C busy_us=B NAME_us=X ...
//
// where client_us is CMD's own user+system CPU time (from its rusage, so it
// is exact and includes nothing else the script runs) and NAME_us is the
// user+system CPU time the long-running process PID spent while CMD ran,
// taken from /proc/PID/stat before and after. /proc/PID/stat counts every
// thread, including threads that exited meanwhile, at clock-tick resolution
// (10 ms at the usual 100 Hz); runs last seconds, so that is under 1 %.
// busy_us is the CPU time the whole machine spent running tasks (or lost to
// the hypervisor) during the run; see machineBusy.
//
// idle opens N connections to a proxy, sends one GET on each, holds them
// idle and prints the proxy's VmRSS before and after (see idle.go):
//
//	conns=N rss_before_kb=B rss_after_kb=A open_ms=T alive=L
package main

import (
	"errors"
	"flag"
	"fmt"
	"net"
	"os"
	"os/exec"
	"os/signal"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// clockTicksPerSecond is USER_HZ. Linux fixes it at 100 on every
// architecture Go supports (the kernel scales its internal HZ to it), so it
// is not read from sysconf, which Go cannot call without cgo.
const clockTicksPerSecond = 100

func main() {
	if len(os.Args) < 2 {
		usage()
	}
	var err error
	switch os.Args[1] {
	case "freeport":
		err = freePorts(os.Args[2:])
	case "measure":
		err = measure(os.Args[2:])
	case "idle":
		err = idle(os.Args[2:])
	case "mixed":
		err = mixed(os.Args[2:])
	default:
		usage()
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "benchtool:", err)
		os.Exit(1)
	}
}

func usage() {
	fmt.Fprintln(os.Stderr, "usage: benchtool freeport [N] | benchtool measure [-pid NAME=PID]... -out FILE -- CMD ARGS... | benchtool idle -addr HOST:PORT -pid PID -conns N [flags] | benchtool mixed -tests T1,T2 -- redis-benchmark ARGS...")
	os.Exit(2)
}

// freePorts holds all N listeners open until every port is chosen, so the
// ports are distinct; the usual small race (someone else binding the port
// before our server does) remains and is acceptable on a bench machine.
func freePorts(args []string) error {
	n := 1
	if len(args) > 0 {
		var err error
		if n, err = strconv.Atoi(args[0]); err != nil || n < 1 {
			return fmt.Errorf("freeport: bad count %q", args[0])
		}
	}
	var ports []string
	for range n {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return err
		}
		defer l.Close()
		ports = append(ports, strconv.Itoa(l.Addr().(*net.TCPAddr).Port))
	}
	fmt.Println(strings.Join(ports, " "))
	return nil
}

type pidFlag []namedPID

type namedPID struct {
	name string
	pid  int
}

func (p *pidFlag) String() string { return fmt.Sprint(*p) }

func (p *pidFlag) Set(v string) error {
	name, num, ok := strings.Cut(v, "=")
	pid, err := strconv.Atoi(num)
	if !ok || name == "" || err != nil || pid <= 0 {
		return fmt.Errorf("want NAME=PID, got %q", v)
	}
	*p = append(*p, namedPID{name, pid})
	return nil
}

func measure(args []string) error {
	fs := flag.NewFlagSet("measure", flag.ContinueOnError)
	var pids pidFlag
	fs.Var(&pids, "pid", "NAME=PID of a process whose CPU time to sample (repeatable)")
	out := fs.String("out", "", "file for the command's stdout (required: our stdout carries the result line)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	cmdArgs := fs.Args()
	if len(cmdArgs) == 0 {
		return errors.New("measure: no command")
	}

	cmd := exec.Command(cmdArgs[0], cmdArgs[1:]...)
	if *out == "" {
		return errors.New("measure: -out is required")
	}
	f, err := os.Create(*out)
	if err != nil {
		return err
	}
	defer f.Close()
	cmd.Stdout = f
	cmd.Stderr = os.Stderr

	before := make([]time.Duration, len(pids))
	for i, p := range pids {
		d, err := procCPU(p.pid)
		if err != nil {
			return err
		}
		before[i] = d
	}
	busyBefore, err := machineBusy()
	if err != nil {
		return err
	}
	// The script stops us with SIGTERM when it is interrupted; the command must
	// not outlive us, and it may ignore SIGINT (bash starts background jobs
	// that way), so it is killed outright.
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, syscall.SIGINT, syscall.SIGTERM)
	start := time.Now()
	if err := cmd.Start(); err != nil {
		return err
	}
	go func() {
		s := <-sigs
		cmd.Process.Kill()
		fmt.Fprintf(os.Stderr, "benchtool: %v: stopped %s\n", s, cmdArgs[0])
	}()
	runErr := cmd.Wait()
	wall := time.Since(start)
	busyAfter, err := machineBusy()
	if err != nil {
		return err
	}
	after := make([]time.Duration, len(pids))
	for i, p := range pids {
		d, err := procCPU(p.pid)
		if err != nil {
			// The process died during the run: its numbers are meaningless.
			return err
		}
		after[i] = d
	}
	if runErr != nil {
		return fmt.Errorf("%s: %w", cmdArgs[0], runErr)
	}

	ru := cmd.ProcessState.SysUsage().(*syscall.Rusage)
	client := time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
	fields := []string{
		fmt.Sprintf("wall_us=%d", wall.Microseconds()),
		fmt.Sprintf("client_us=%d", client.Microseconds()),
		fmt.Sprintf("busy_us=%d", (busyAfter - busyBefore).Microseconds()),
	}
	for i, p := range pids {
		fields = append(fields, fmt.Sprintf("%s_us=%d", p.name, (after[i]-before[i]).Microseconds()))
	}
	fmt.Println(strings.Join(fields, " "))
	return nil
}

// procCPU returns utime+stime of every thread of pid, live or exited.
func procCPU(pid int) (time.Duration, error) {
	name := fmt.Sprintf("/proc/%d/stat", pid)
	b, err := os.ReadFile(name)
	if err != nil {
		return 0, err
	}
	d, err := parseProcStat(string(b))
	if err != nil {
		return 0, fmt.Errorf("%s: %w", name, err)
	}
	return d, nil
}

// parseProcStat returns utime+stime from the text of /proc/PID/stat.
func parseProcStat(s string) (time.Duration, error) {
	// The command name (field 2) is in parentheses and may contain spaces
	// or parentheses, so fields are counted from the last ')'.
	i := strings.LastIndexByte(s, ')')
	if i < 0 {
		return 0, errors.New("no ')' after the command name")
	}
	f := strings.Fields(s[i+1:])
	// After ')': f[0] is field 3 (state), so utime (14) is f[11], stime (15) f[12].
	if len(f) < 13 {
		return 0, errors.New("too few fields")
	}
	utime, err1 := strconv.ParseInt(f[11], 10, 64)
	stime, err2 := strconv.ParseInt(f[12], 10, 64)
	if err1 != nil || err2 != nil {
		return 0, errors.New("utime or stime is not a number")
	}
	return ticks(utime + stime), nil
}

// machineBusy returns the CPU time all CPUs of the machine spent running
// tasks or stolen by the hypervisor (user, nice, system, steal) since boot.
// irq and softirq are left out: loopback networking runs in softirq, and
// most of that is the benchmark's own traffic, not a neighbour's. measure
// reports it so the script can tell how much CPU something other than the
// benchmarked processes used during a run: a busy neighbour invalidates the
// numbers.
func machineBusy() (time.Duration, error) {
	b, err := os.ReadFile("/proc/stat")
	if err != nil {
		return 0, err
	}
	d, err := parseMachineBusy(string(b))
	if err != nil {
		return 0, fmt.Errorf("/proc/stat: %w", err)
	}
	return d, nil
}

// parseMachineBusy returns user+nice+system+steal from the text of /proc/stat.
func parseMachineBusy(s string) (time.Duration, error) {
	line, _, _ := strings.Cut(s, "\n")
	f := strings.Fields(line)
	// cpu user nice system idle iowait irq softirq steal guest guest_nice;
	// guest time is already included in user.
	if len(f) < 9 || f[0] != "cpu" {
		return 0, errors.New("first line is not the 'cpu' total")
	}
	var sum int64
	for _, i := range []int{1, 2, 3, 8} {
		v, err := strconv.ParseInt(f[i], 10, 64)
		if err != nil {
			return 0, err
		}
		sum += v
	}
	return ticks(sum), nil
}

func ticks(n int64) time.Duration {
	return time.Duration(n) * time.Second / clockTicksPerSecond
}

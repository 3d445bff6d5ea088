package main

import (
	"context"
	"os"
	"os/signal"
	"syscall"

	"golang.org/x/sys/unix"
)

// stopOnClosedOutput calls stop when standard output or error turns out to
// be a pipe whose reader has gone, as in `pgdispatch demo | head`.
//
// Left alone, the Go runtime ends the process at its next write there, with
// no shutdown: a throwaway cluster started by demo or bench would be left
// running. Asking for SIGPIPE makes that write fail with EPIPE instead, and
// the signal arrives here. Writes to any broken socket raise it too, so it
// only stops the process when one of the two outputs is the broken one. The
// signal stays asked for: released, a later write would end the process.
func stopOnClosedOutput(ctx context.Context, stop func()) {
	pipe := make(chan os.Signal, 1)
	signal.Notify(pipe, syscall.SIGPIPE)
	go func() {
		for {
			select {
			case <-ctx.Done():
				return
			case <-pipe:
				if readerGone(os.Stdout) || readerGone(os.Stderr) {
					stop()
					return
				}
			}
		}
	}()
}

// readerGone reports whether f is a pipe or socket whose other end is closed:
// polling its write end reports an error or a hang-up. (Through SyscallConn,
// which leaves f's blocking mode as it is, where Fd would change it.)
func readerGone(f *os.File) bool {
	raw, err := f.SyscallConn()
	if err != nil {
		return false
	}
	var gone bool
	_ = raw.Control(func(fd uintptr) {
		fds := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLOUT}}
		n, err := unix.Poll(fds, 0)
		gone = err == nil && n > 0 && fds[0].Revents&(unix.POLLERR|unix.POLLHUP) != 0
	})
	return gone
}

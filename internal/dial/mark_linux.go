package dial

import (
	"syscall"

	"golang.org/x/sys/unix"
)

// markControl sets the socket's mark (SO_MARK, which needs CAP_NET_ADMIN)
// before it connects.
func markControl(mark uint32) func(network, address string, c syscall.RawConn) error {
	return func(_, _ string, c syscall.RawConn) error {
		var serr error
		if err := c.Control(func(fd uintptr) {
			serr = unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_MARK, int(mark))
		}); err != nil {
			return err
		}
		return serr
	}
}

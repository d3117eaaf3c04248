package kubecluster_test

import (
	"bufio"
	"context"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"time"

	"golang.org/x/sys/unix"

	"github.com/weirlb/weir/test/lab"
)

// attemptTimeout bounds one request of the load, connection included.
const attemptTimeout = 2 * time.Second

// attempt makes one request on a new connection from `from` to `to`. A
// failure says where it stopped, from what the client's kernel knows of
// the connection (see delivery), so that a backend that answered late is
// told apart from a path that lost the request.
func attempt(from *lab.Netns, to netip.AddrPort) error {
	ctx, cancel := context.WithTimeout(context.Background(), attemptTimeout)
	defer cancel()
	conn, err := from.DialContext(ctx, "tcp", to.String())
	if err != nil {
		return fmt.Errorf("no connection: %w", err)
	}
	defer conn.Close()
	deadline, _ := ctx.Deadline()
	conn.SetDeadline(deadline)
	req, _ := http.NewRequest(http.MethodGet, "http://"+to.String()+"/", nil)
	req.Close = true
	if err := req.Write(conn); err != nil {
		return fmt.Errorf("writing the request: %w (%s)", err, delivery(conn))
	}
	resp, err := http.ReadResponse(bufio.NewReader(conn), req)
	if err != nil {
		return fmt.Errorf("no answer: %w (%s)", err, delivery(conn))
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("answer %s", resp.Status)
	}
	return nil
}

// delivery reads the client's TCP state of conn: whether the far end's
// TCP acknowledged everything sent (through the load balancer, that is
// the pod's kernel: the request reached the pod), and how many segments
// were sent again.
func delivery(conn net.Conn) string {
	tc, ok := conn.(*net.TCPConn)
	if !ok {
		return "no TCP state"
	}
	raw, err := tc.SyscallConn()
	if err != nil {
		return err.Error()
	}
	var info *unix.TCPInfo
	if cerr := raw.Control(func(fd uintptr) {
		info, err = unix.GetsockoptTCPInfo(int(fd), unix.IPPROTO_TCP, unix.TCP_INFO)
	}); cerr != nil || err != nil {
		return fmt.Sprintf("no TCP state: %v %v", cerr, err)
	}
	if info.Unacked == 0 && info.Total_retrans == 0 {
		return fmt.Sprintf("delivered: the pod acknowledged all %d bytes, no segment sent twice; the pod answered late", info.Bytes_acked)
	}
	return fmt.Sprintf("not delivered: %d segments unacknowledged, %d sent again", info.Unacked, info.Total_retrans)
}

package nfwire

import (
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"strings"
	"syscall"

	"github.com/mdlayher/netlink"
	"golang.org/x/sys/unix"
)

// Conn is a netlink socket to nf_tables that stays open: the kernel frees
// what a transaction deleted in the background, where closing the socket
// waits for it (nf_tables flushes its destroy work on NETLINK_URELEASE).
type Conn struct {
	conn *netlink.Conn
	seq  uint32
}

// Dial opens a socket in the current network namespace.
func Dial() (*Conn, error) {
	conn, err := netlink.Dial(unix.NETLINK_NETFILTER, nil)
	if err != nil {
		return nil, err
	}
	return &Conn{conn: conn}, nil
}

func (c *Conn) Close() error { return c.conn.Close() }

// Commit sends the batch as one transaction, atomic like an nft run, and
// reads the kernel's answer to every message: nil when it took them all.
// The batch's bytes go as they are, in one datagram. After an error the
// kernel has aborted the whole transaction; the socket should not be used
// again, as answers may be left on it.
func (c *Conn) Commit(b *Batch) error {
	if b.Empty() {
		return nil
	}
	// The end message goes after the others, then leaves the batch as it
	// was; every message is numbered.
	n := len(b.buf)
	b.control(unix.NFNL_MSG_BATCH_END)
	defer func() { b.buf = b.buf[:n] }()
	for off := 0; off < len(b.buf); off += int(binary.NativeEndian.Uint32(b.buf[off:])) {
		c.seq++
		binary.NativeEndian.PutUint32(b.buf[off+8:], c.seq)
	}
	if err := c.send(b.buf); err != nil {
		return fmt.Errorf("sending a transaction: %w", err)
	}
	var errs error
	for range b.msgs {
		if _, err := c.conn.Receive(); err != nil {
			if errors.Is(err, os.ErrPermission) || errors.Is(err, syscall.ENOBUFS) {
				return err // the kernel sends no other answer
			}
			errs = errors.Join(errs, err)
		}
	}
	return errs
}

// send writes one datagram to the kernel. nf_tables processes a
// transaction within the call.
func (c *Conn) send(b []byte) error {
	rc, err := c.conn.SyscallConn()
	if err != nil {
		return err
	}
	kernel := &unix.SockaddrNetlink{Family: unix.AF_NETLINK}
	var serr error
	if err := rc.Write(func(fd uintptr) bool {
		serr = unix.Sendmsg(int(fd), b, nil, kernel, 0)
		return serr != unix.EAGAIN
	}); err != nil {
		return err
	}
	return serr
}

// Objects names what a table holds.
type Objects struct{ Chains, Sets, Maps []string }

// ListTable names the chains, sets and maps of fam's table: the kernel's
// dumps of their names, without their contents.
func (c *Conn) ListTable(fam Family, table string) (Objects, error) {
	var objs Objects
	chains, err := c.dump(fam, unix.NFT_MSG_GETCHAIN, unix.NFTA_CHAIN_TABLE, table)
	if err != nil {
		return objs, fmt.Errorf("listing %s chains: %w", fam, err)
	}
	for _, attrs := range chains {
		if attrs.string(unix.NFTA_CHAIN_TABLE) == table {
			objs.Chains = append(objs.Chains, attrs.string(unix.NFTA_CHAIN_NAME))
		}
	}
	if len(objs.Chains) == 0 {
		// No chains: a table with none is taken for missing (the
		// callers' tables always have chains), and the kernel refuses
		// to list the sets of a missing table.
		return objs, nil
	}
	sets, err := c.dump(fam, unix.NFT_MSG_GETSET, unix.NFTA_SET_TABLE, table)
	if err != nil {
		return objs, fmt.Errorf("listing %s sets: %w", fam, err)
	}
	for _, attrs := range sets {
		flags := uint32(0)
		if v := attrs[unix.NFTA_SET_FLAGS]; len(v) == 4 {
			flags = binary.BigEndian.Uint32(v)
		}
		switch {
		case attrs.string(unix.NFTA_SET_TABLE) != table:
		case flags&unix.NFT_SET_MAP != 0:
			objs.Maps = append(objs.Maps, attrs.string(unix.NFTA_SET_NAME))
		default:
			objs.Sets = append(objs.Sets, attrs.string(unix.NFTA_SET_NAME))
		}
	}
	return objs, nil
}

// dump asks the kernel for its objects of one kind (typ: a GET message) in
// fam's table (named by the attribute tableAttr), and returns each one's
// attributes.
func (c *Conn) dump(fam Family, typ, tableAttr uint16, table string) ([]attrs, error) {
	b := NewBatch(table)
	start := b.begin(fam)
	b.attrString(tableAttr, table)
	b.end(typ, start)
	m := b.msgs[0]
	msgs, err := c.conn.Execute(netlink.Message{
		Header: netlink.Header{Type: netlink.HeaderType(m.typ), Flags: netlink.Request | netlink.Dump},
		Data:   b.buf[m.start+nlmsghdrLen : m.end],
	})
	if err != nil {
		return nil, err
	}
	var out []attrs
	for _, msg := range msgs {
		if len(msg.Data) < 4 {
			continue
		}
		ad, err := netlink.NewAttributeDecoder(msg.Data[4:])
		if err != nil {
			return nil, err
		}
		a := attrs{}
		for ad.Next() {
			a[ad.Type()] = ad.Bytes()
		}
		if err := ad.Err(); err != nil {
			return nil, err
		}
		out = append(out, a)
	}
	return out, nil
}

// attrs are a message's attributes by type.
type attrs map[uint16][]byte

// string is a string attribute, without its terminating NUL.
func (a attrs) string(typ uint16) string { return strings.TrimSuffix(string(a[typ]), "\x00") }

package nfwire

import (
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"syscall"

	"golang.org/x/sys/unix"
)

// Reading a table back is a dump: one request, and the kernel's answers
// in as many reads as it takes, each parsed as it arrives.

// Reader is a netlink socket for dumps, apart from a Conn's transactions.
type Reader struct {
	fd  int
	buf []byte
	seq uint32
}

// NewReader opens a socket for dumps in the current network namespace.
func NewReader() (*Reader, error) {
	fd, err := unix.Socket(unix.AF_NETLINK, unix.SOCK_RAW|unix.SOCK_CLOEXEC, unix.NETLINK_NETFILTER)
	if err != nil {
		return nil, fmt.Errorf("opening a netlink socket to nf_tables: %w", err)
	}
	if err := unix.Bind(fd, &unix.SockaddrNetlink{Family: unix.AF_NETLINK}); err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("binding a netlink socket to nf_tables: %w", err)
	}
	// Large reads: the kernel fills each with as many answers as fit.
	_ = unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_RCVBUF, 4<<20)
	return &Reader{fd: fd, buf: make([]byte, 1<<20)}, nil
}

func (r *Reader) Close() error { return unix.Close(r.fd) }

// RuleCounts counts the rules of each chain of fam's table.
func (r *Reader) RuleCounts(fam Family, table string) (map[string]int, error) {
	counts := map[string]int{}
	err := r.dump(fam, unix.NFT_MSG_GETRULE, unix.NFTA_RULE_TABLE, table, func(data []byte) error {
		for typ, v := range attributes(data) {
			if typ == unix.NFTA_RULE_CHAIN {
				counts[cstring(v)]++
			}
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("listing the rules of %s table %q: %w", fam, table, err)
	}
	return counts, nil
}

// Counter is a named counter's values.
type Counter struct{ Packets, Bytes uint64 }

// objectCounter is NFT_OBJECT_COUNTER, a named object's type.
const objectCounter = 1

// Counters reads the named counters of fam's table: one dump of its
// stateful objects, which the kernel answers without the rest of the
// table (nft lists the whole table to print one counter).
func (r *Reader) Counters(fam Family, table string) (map[string]Counter, error) {
	counters := map[string]Counter{}
	err := r.dump(fam, unix.NFT_MSG_GETOBJ, unix.NFTA_OBJ_TABLE, table, func(data []byte) error {
		var name string
		var typ uint32
		var c Counter
		for t, v := range attributes(data) {
			switch t {
			case unix.NFTA_OBJ_NAME:
				name = cstring(v)
			case unix.NFTA_OBJ_TYPE:
				if len(v) == 4 {
					typ = binary.BigEndian.Uint32(v)
				}
			case unix.NFTA_OBJ_DATA:
				for ct, cv := range attributes(v) {
					if len(cv) != 8 {
						continue
					}
					switch ct {
					case unix.NFTA_COUNTER_PACKETS:
						c.Packets = binary.BigEndian.Uint64(cv)
					case unix.NFTA_COUNTER_BYTES:
						c.Bytes = binary.BigEndian.Uint64(cv)
					}
				}
			}
		}
		if typ == objectCounter && name != "" {
			counters[name] = c
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("listing the counters of %s table %q: %w", fam, table, err)
	}
	return counters, nil
}

// dump sends a dump request of typ for fam's table and hands each
// answer's attributes (after the nfgenmsg header) to each, until the
// kernel says it is done.
func (r *Reader) dump(fam Family, typ, tableAttr uint16, table string, each func([]byte) error) error {
	b := NewBatch(table)
	start := b.begin(fam)
	b.attrString(tableAttr, table)
	b.end(typ, start)
	// The request alone, outside a transaction, asking for a dump.
	m := b.msgs[0]
	req := b.buf[m.start:m.end]
	r.seq++
	binary.NativeEndian.PutUint16(req[6:], unix.NLM_F_REQUEST|unix.NLM_F_DUMP)
	binary.NativeEndian.PutUint32(req[8:], r.seq)
	if err := unix.Sendto(r.fd, req, 0, &unix.SockaddrNetlink{Family: unix.AF_NETLINK}); err != nil {
		return err
	}
	for {
		n, _, err := unix.Recvfrom(r.fd, r.buf, 0)
		if err != nil {
			if errors.Is(err, syscall.EINTR) {
				continue
			}
			return err
		}
		msgs := r.buf[:n]
		for len(msgs) >= unix.NLMSG_HDRLEN {
			l := int(binary.NativeEndian.Uint32(msgs[0:]))
			t := binary.NativeEndian.Uint16(msgs[4:])
			seq := binary.NativeEndian.Uint32(msgs[8:])
			if l < unix.NLMSG_HDRLEN || l > len(msgs) {
				return errors.New("a truncated netlink message")
			}
			data := msgs[unix.NLMSG_HDRLEN:l]
			msgs = msgs[min(nlAlign(l), len(msgs)):]
			if seq != r.seq {
				continue // an answer to an earlier, abandoned dump
			}
			switch t {
			case unix.NLMSG_DONE:
				return nil
			case unix.NLMSG_ERROR:
				if len(data) >= 4 {
					if code := int32(binary.NativeEndian.Uint32(data)); code != 0 {
						return os.NewSyscallError("netlink", syscall.Errno(-code))
					}
				}
				return nil
			}
			if len(data) < 4 {
				continue
			}
			if err := each(data[4:]); err != nil {
				return err
			}
		}
	}
}

func nlAlign(n int) int { return (n + 3) &^ 3 }

// attributes walks netlink attributes: each one's type (without the nested
// and byte-order flags) and payload.
func attributes(b []byte) func(yield func(uint16, []byte) bool) {
	return func(yield func(uint16, []byte) bool) {
		for len(b) >= 4 {
			l := int(binary.NativeEndian.Uint16(b[0:]))
			t := binary.NativeEndian.Uint16(b[2:]) &^ (unix.NLA_F_NESTED | unix.NLA_F_NET_BYTEORDER)
			if l < 4 || l > len(b) {
				return
			}
			if !yield(t, b[4:l]) {
				return
			}
			b = b[min(nlAlign(l), len(b)):]
		}
	}
}

func cstring(b []byte) string {
	for i, c := range b {
		if c == 0 {
			return string(b[:i])
		}
	}
	return string(b)
}

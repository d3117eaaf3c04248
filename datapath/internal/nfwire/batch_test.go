package nfwire

import (
	"bytes"
	"encoding/binary"
	"testing"

	"golang.org/x/sys/unix"
)

// TestBatchIsLaidOutAsSent: a batch's buffer is the datagram Commit sends:
// the begin message, then each message whole (its netlink header's length,
// type and flags, nft's "add" for what creates); a batch Reset lays out
// the same bytes again as a new one, keeping its memory.
func TestBatchIsLaidOutAsSent(t *testing.T) {
	fill := func(b *Batch) {
		b.NewTable(IPv4, "a comment")
		l := b.Elements(unix.NFT_MSG_NEWSETELEM, IPv4, "backends")
		l.Add([]byte{10, 0, 0, 1}, []byte{10, 244, 0, 1, 0, 80, 0, 0})
		l.End()
		d := b.Elements(unix.NFT_MSG_DELSETELEM, IPv4, "backends")
		d.Add([]byte{10, 0, 0, 2}, nil)
		d.End()
	}
	b := NewBatch("weir")
	fill(b)
	type msg struct{ typ, flags uint16 }
	var got []msg
	for off := 0; off < len(b.buf); {
		n := int(binary.NativeEndian.Uint32(b.buf[off:]))
		if n < nlmsghdrLen || off+n > len(b.buf) || n%4 != 0 {
			t.Fatalf("message at %d: length %d in a buffer of %d", off, n, len(b.buf))
		}
		got = append(got, msg{binary.NativeEndian.Uint16(b.buf[off+4:]), binary.NativeEndian.Uint16(b.buf[off+6:])})
		off += n
	}
	const sub = unix.NFNL_SUBSYS_NFTABLES << 8
	req, ack, create := uint16(unix.NLM_F_REQUEST), uint16(unix.NLM_F_ACK), uint16(unix.NLM_F_CREATE)
	want := []msg{
		{unix.NFNL_MSG_BATCH_BEGIN, req},
		{sub | unix.NFT_MSG_NEWTABLE, req | ack | create},
		{sub | unix.NFT_MSG_NEWSETELEM, req | ack | create},
		{sub | unix.NFT_MSG_DELSETELEM, req | ack},
	}
	if len(got) != len(want) {
		t.Fatalf("messages %v, want %v", got, want)
	}
	for i := range want {
		if got[i] != want[i] {
			t.Errorf("message %d: type %#x flags %#x, want type %#x flags %#x", i, got[i].typ, got[i].flags, want[i].typ, want[i].flags)
		}
	}
	i := 0
	for typ, body := range b.Messages() {
		if typ != want[i+1].typ || body[0] != byte(IPv4) {
			t.Errorf("Messages()[%d]: type %#x, family %d", i, typ, body[0])
		}
		i++
	}

	first := bytes.Clone(b.buf)
	b.Reset()
	if len(b.msgs) != 0 || len(b.buf) != nlmsghdrLen+4 {
		t.Fatalf("after Reset: %d messages, %d bytes; want the begin message alone", len(b.msgs), len(b.buf))
	}
	fill(b)
	if !bytes.Equal(b.buf, first) {
		t.Fatal("a batch Reset and filled again differs from the first")
	}
}

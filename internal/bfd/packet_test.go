package bfd

import (
	"bytes"
	"testing"
)

// A packet as RFC 5880 4.1 lays it out, byte by byte: version 1, diag 1,
// state Up with Poll, multiplier 3, length 24, discriminators, 300 ms and
// 100 ms in microseconds, echo 0.
var upWithPoll = []byte{
	0x21, 0xe0, 0x03, 0x18,
	0x11, 0x22, 0x33, 0x44,
	0x55, 0x66, 0x77, 0x88,
	0x00, 0x04, 0x93, 0xe0,
	0x00, 0x01, 0x86, 0xa0,
	0x00, 0x00, 0x00, 0x00,
}

func TestPacketWireFormat(t *testing.T) {
	for _, tc := range []struct {
		name string
		p    packet
		wire []byte
	}{
		{"Up with Poll, diagnostic 1", packet{Diag: DiagDetectionExpired, State: Up, Poll: true, DetectMult: 3, MyDisc: 0x11223344, YourDisc: 0x55667788,
			DesiredMinTx: 300000, RequiredMinRx: 100000}, upWithPoll},
		// A first packet: the peer's discriminator unknown, the slow 1 s
		// of a session not Up (6.8.3).
		{"Down, your discriminator 0", packet{State: Down, DetectMult: 3, MyDisc: 1, DesiredMinTx: 1000000, RequiredMinRx: 100000}, []byte{
			0x20, 0x40, 0x03, 0x18,
			0x00, 0x00, 0x00, 0x01,
			0x00, 0x00, 0x00, 0x00,
			0x00, 0x0f, 0x42, 0x40,
			0x00, 0x01, 0x86, 0xa0,
			0x00, 0x00, 0x00, 0x00,
		}},
		{"Up with Final", packet{State: Up, Final: true, DetectMult: 5, MyDisc: 0xfffffffe, YourDisc: 2, DesiredMinTx: 10000, RequiredMinRx: 60000000}, []byte{
			0x20, 0xd0, 0x05, 0x18,
			0xff, 0xff, 0xff, 0xfe,
			0x00, 0x00, 0x00, 0x02,
			0x00, 0x00, 0x27, 0x10,
			0x03, 0x93, 0x87, 0x00,
			0x00, 0x00, 0x00, 0x00,
		}},
		{"AdminDown, diagnostic 7", packet{Diag: DiagAdminDown, State: AdminDown, DetectMult: 3, MyDisc: 9, YourDisc: 8, DesiredMinTx: 1000000, RequiredMinRx: 300000}, []byte{
			0x27, 0x00, 0x03, 0x18,
			0x00, 0x00, 0x00, 0x09,
			0x00, 0x00, 0x00, 0x08,
			0x00, 0x0f, 0x42, 0x40,
			0x00, 0x04, 0x93, 0xe0,
			0x00, 0x00, 0x00, 0x00,
		}},
	} {
		if got := tc.p.marshal(); !bytes.Equal(got, tc.wire) {
			t.Errorf("%s: marshal: % x\nwant      % x", tc.name, got, tc.wire)
		}
		got, err := parse(tc.wire)
		if err != nil || got != tc.p {
			t.Errorf("%s: parse: %+v, %v\nwant %+v", tc.name, got, err, tc.p)
		}
	}
	// Bytes beyond the length field (padding a sender may add) are not
	// the packet's.
	if _, err := parse(append(bytes.Clone(upWithPoll), 0, 0, 0, 0)); err != nil {
		t.Errorf("a packet with trailing bytes: %v", err)
	}
}

// The checks of RFC 5880 6.8.6 that need no session discard a packet.
func TestInvalidPacketsAreDiscarded(t *testing.T) {
	mutate := func(f func(b []byte) []byte) []byte {
		return f(bytes.Clone(upWithPoll))
	}
	for name, b := range map[string][]byte{
		"short":              upWithPoll[:23],
		"version 2":          mutate(func(b []byte) []byte { b[0] = 2<<5 | 1; return b }),
		"length beyond data": mutate(func(b []byte) []byte { b[3] = 26; return b }),
		"length below 24":    mutate(func(b []byte) []byte { b[3] = 20; return b }),
		"authenticated":      mutate(func(b []byte) []byte { b[1] |= 1 << 2; return b }),
		"multiplier 0":       mutate(func(b []byte) []byte { b[2] = 0; return b }),
		"multipoint":         mutate(func(b []byte) []byte { b[1] |= 1; return b }),
		"my discriminator 0": mutate(func(b []byte) []byte { copy(b[4:8], []byte{0, 0, 0, 0}); return b }),
		"your discriminator 0 while Up": mutate(func(b []byte) []byte {
			copy(b[8:12], []byte{0, 0, 0, 0})
			return b
		}),
	} {
		if p, err := parse(b); err == nil {
			t.Errorf("%s: accepted as %+v", name, p)
		}
	}
	// Your Discriminator 0 is how a peer that knows nothing of us speaks.
	down := mutate(func(b []byte) []byte { b[1] = byte(Down) << 6; copy(b[8:12], []byte{0, 0, 0, 0}); return b })
	if _, err := parse(down); err != nil {
		t.Errorf("Down with your discriminator 0: %v", err)
	}
}

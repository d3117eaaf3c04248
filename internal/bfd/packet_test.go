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
	p := packet{Diag: DiagDetectionExpired, State: Up, Poll: true, DetectMult: 3, MyDisc: 0x11223344, YourDisc: 0x55667788,
		DesiredMinTx: 300000, RequiredMinRx: 100000}
	if got := p.marshal(); !bytes.Equal(got, upWithPoll) {
		t.Errorf("marshal: % x\nwant      % x", got, upWithPoll)
	}
	got, err := parse(upWithPoll)
	if err != nil || got != p {
		t.Errorf("parse: %+v, %v\nwant %+v", got, err, p)
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

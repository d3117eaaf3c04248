package bfd

import (
	"encoding/binary"
	"errors"
	"fmt"
)

// State is a session's state (RFC 5880 4.1).
type State uint8

const (
	AdminDown State = 0
	Down      State = 1
	Init      State = 2
	Up        State = 3
)

func (s State) String() string {
	switch s {
	case AdminDown:
		return "AdminDown"
	case Down:
		return "Down"
	case Init:
		return "Init"
	case Up:
		return "Up"
	}
	return fmt.Sprintf("State(%d)", uint8(s))
}

// Diag says why a session last left Up (RFC 5880 4.1).
type Diag uint8

const (
	DiagNone             Diag = 0
	DiagDetectionExpired Diag = 1
	DiagNeighborDown     Diag = 3
	DiagAdminDown        Diag = 7
)

func (d Diag) String() string {
	switch d {
	case DiagNone:
		return "No Diagnostic"
	case DiagDetectionExpired:
		return "Control Detection Time Expired"
	case 2:
		return "Echo Function Failed"
	case DiagNeighborDown:
		return "Neighbor Signaled Session Down"
	case 4:
		return "Forwarding Plane Reset"
	case 5:
		return "Path Down"
	case 6:
		return "Concatenated Path Down"
	case DiagAdminDown:
		return "Administratively Down"
	case 8:
		return "Reverse Concatenated Path Down"
	}
	return fmt.Sprintf("Diag(%d)", uint8(d))
}

// packetLen is a control packet without authentication.
const packetLen = 24

// packet is a BFD control packet (RFC 5880 4.1); intervals in
// microseconds, as on the wire.
type packet struct {
	Diag          Diag
	State         State
	Poll, Final   bool
	CPI           bool // Control Plane Independent
	Auth          bool
	Demand        bool
	Multipoint    bool
	DetectMult    uint8
	MyDisc        uint32
	YourDisc      uint32
	DesiredMinTx  uint32
	RequiredMinRx uint32
	// RequiredMinEchoRx is always sent as 0: no echo function.
	RequiredMinEchoRx uint32
}

func (p packet) marshal() []byte {
	b := make([]byte, packetLen)
	b[0] = 1<<5 | byte(p.Diag)&0x1f // version 1
	flags := byte(p.State) << 6
	for i, set := range []bool{p.Poll, p.Final, p.CPI, p.Auth, p.Demand, p.Multipoint} {
		if set {
			flags |= 1 << (5 - i)
		}
	}
	b[1] = flags
	b[2] = p.DetectMult
	b[3] = packetLen
	binary.BigEndian.PutUint32(b[4:], p.MyDisc)
	binary.BigEndian.PutUint32(b[8:], p.YourDisc)
	binary.BigEndian.PutUint32(b[12:], p.DesiredMinTx)
	binary.BigEndian.PutUint32(b[16:], p.RequiredMinRx)
	binary.BigEndian.PutUint32(b[20:], p.RequiredMinEchoRx)
	return b
}

var errInvalid = errors.New("invalid BFD control packet")

// parse reads a control packet and applies the checks of RFC 5880 6.8.6
// that need no session: a packet failing one is discarded.
func parse(b []byte) (packet, error) {
	if len(b) < packetLen {
		return packet{}, fmt.Errorf("%w: %d bytes", errInvalid, len(b))
	}
	if v := b[0] >> 5; v != 1 {
		return packet{}, fmt.Errorf("%w: version %d", errInvalid, v)
	}
	p := packet{
		Diag:              Diag(b[0] & 0x1f),
		State:             State(b[1] >> 6),
		Poll:              b[1]&(1<<5) != 0,
		Final:             b[1]&(1<<4) != 0,
		CPI:               b[1]&(1<<3) != 0,
		Auth:              b[1]&(1<<2) != 0,
		Demand:            b[1]&(1<<1) != 0,
		Multipoint:        b[1]&1 != 0,
		DetectMult:        b[2],
		MyDisc:            binary.BigEndian.Uint32(b[4:]),
		YourDisc:          binary.BigEndian.Uint32(b[8:]),
		DesiredMinTx:      binary.BigEndian.Uint32(b[12:]),
		RequiredMinRx:     binary.BigEndian.Uint32(b[16:]),
		RequiredMinEchoRx: binary.BigEndian.Uint32(b[20:]),
	}
	length := int(b[3])
	switch {
	case length < packetLen || length > len(b):
		return packet{}, fmt.Errorf("%w: length %d of %d bytes", errInvalid, length, len(b))
	case p.Auth:
		// No authentication is configured on any session: RFC 5880
		// 6.8.6 discards an authenticated packet then.
		return packet{}, fmt.Errorf("%w: authenticated, and no session authenticates", errInvalid)
	case p.DetectMult == 0:
		return packet{}, fmt.Errorf("%w: detect multiplier 0", errInvalid)
	case p.Multipoint:
		return packet{}, fmt.Errorf("%w: multipoint bit set", errInvalid)
	case p.MyDisc == 0:
		return packet{}, fmt.Errorf("%w: my discriminator 0", errInvalid)
	case p.YourDisc == 0 && p.State != Down && p.State != AdminDown:
		return packet{}, fmt.Errorf("%w: your discriminator 0 in state %s", errInvalid, p.State)
	}
	return p, nil
}

// Package bfd is Bidirectional Forwarding Detection for the BGP speakers:
// it finds within milliseconds that a peer stopped forwarding, where BGP's
// own hold timer takes seconds. Asynchronous mode of RFC 5880 over UDP,
// single hop over IPv4 and IPv6 (RFC 5881, link-local peers by their
// link) and multi-hop (RFC 5883), with a Poll sequence for a changed
// profile and a damping hold-down for a session that flaps. It has no
// echo mode and no authentication.
//
// A Manager runs the sessions it is given and tells its client when a
// peer becomes unusable (its detection time passed, or it said Down) and
// usable again. A session this end removes, one never Up, and one whose
// peer said AdminDown (RFC 5882 3.2: BFD taken away on purpose) are never
// reported unusable: the client goes on as without BFD.
//
// It runs beside GoBGP v3 rather than inside it: the speakers close and
// open a router's session (DisablePeer, EnablePeer) on what a Manager
// reports, so the BGP layer stayed as it was, and the protocol's timers
// are tested on a fake clock here and against FRR's bfdd and BIRD in the
// lab (test/e2e: TestBFDInterop, TestBFDTakesADeadNodesRoutesAway).
package bfd

package nodewire

import (
	"net/netip"
	"os"
	"testing"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protodesc"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/types/descriptorpb"
	"google.golang.org/protobuf/types/dynamicpb"

	"github.com/weirlb/weir/internal/report"
	weirv1 "github.com/weirlb/weir/proto/weir/v1"
)

// previousRelease is a message as a client or replica of the last release
// knows it: its descriptor from the API baseline (make api-baseline).
func previousRelease(t *testing.T, name protoreflect.FullName) protoreflect.MessageType {
	t.Helper()
	b, err := os.ReadFile("../../proto/baseline.binpb")
	if err != nil {
		t.Fatal(err)
	}
	var set descriptorpb.FileDescriptorSet
	if err := proto.Unmarshal(b, &set); err != nil {
		t.Fatal(err)
	}
	files, err := protodesc.NewFiles(&set)
	if err != nil {
		t.Fatal(err)
	}
	d, err := files.FindDescriptorByName(name)
	if err != nil {
		t.Fatal(err)
	}
	return dynamicpb.NewMessageType(d.(protoreflect.MessageDescriptor))
}

// A client or server replica of the previous release reads only the
// string fields, now deprecated: it still finds every state and family in
// the words it knows.
func TestPreviousReleaseReadsSessionWords(t *testing.T) {
	old := previousRelease(t, "weir.v1.BgpSession")
	for _, state := range []report.BGPState{report.BGPIdle, report.BGPConnect, report.BGPActive, report.BGPOpenSent, report.BGPOpenConfirm, report.BGPEstablished} {
		b, err := proto.Marshal(EncodeSession(report.BGPSession{PeerAddress: netip.MustParseAddr("192.0.2.1"), PeerASN: 64500, State: state,
			Families: []report.BGPFamily{{Name: report.IPv4, Negotiated: true}, {Name: report.IPv6}}}))
		if err != nil {
			t.Fatal(err)
		}
		m := old.New()
		if err := proto.Unmarshal(b, m.Interface()); err != nil {
			t.Fatal(err)
		}
		fields := m.Descriptor().Fields()
		if got := m.Get(fields.ByName("state")).String(); got != string(state) {
			t.Errorf("the previous release reads state %q, want %q", got, state)
		}
		fams := m.Get(fields.ByName("families")).List()
		var got []string
		for i := range fams.Len() {
			f := fams.Get(i).Message()
			got = append(got, f.Get(f.Descriptor().Fields().ByName("family")).String())
		}
		if len(got) != 2 || got[0] != "ipv4" || got[1] != "ipv6" {
			t.Errorf("the previous release reads families %q, want [ipv4 ipv6]", got)
		}
	}
}

// The enums say the state and family; a message from the previous
// release, with only the words, reads the same; where both are set, the
// enum wins.
func TestSessionEnums(t *testing.T) {
	for _, tc := range []struct {
		name  string
		wire  *weirv1.BgpSession
		state report.BGPState
		fam   report.Family
	}{
		{"enums", &weirv1.BgpSession{SessionState: weirv1.BgpSessionState_BGP_SESSION_STATE_OPEN_CONFIRM,
			Families: []*weirv1.BgpFamily{{AddressFamily: weirv1.AddressFamily_ADDRESS_FAMILY_IPV6}}}, report.BGPOpenConfirm, report.IPv6},
		//lint:ignore SA1019 a message of the previous release says only the words
		{"previous release", &weirv1.BgpSession{State: "opensent", Families: []*weirv1.BgpFamily{{Family: "ipv4"}}}, report.BGPOpenSent, report.IPv4},
		//lint:ignore SA1019 a message with both, the words disagreeing
		{"enum over word", &weirv1.BgpSession{State: "active", SessionState: weirv1.BgpSessionState_BGP_SESSION_STATE_ESTABLISHED,
			Families: []*weirv1.BgpFamily{{Family: "ipv4", AddressFamily: weirv1.AddressFamily_ADDRESS_FAMILY_IPV6}}}, report.BGPEstablished, report.IPv6},
	} {
		got := DecodeSession(tc.wire)
		if got.State != tc.state || len(got.Families) != 1 || got.Families[0].Name != tc.fam {
			t.Errorf("%s: read %q %v, want %q [%q]", tc.name, got.State, got.Families, tc.state, tc.fam)
		}
	}
	w := EncodeSession(report.BGPSession{State: report.BGPEstablished, Families: []report.BGPFamily{{Name: report.IPv4}, {Name: report.IPv6}}})
	if w.GetSessionState() != weirv1.BgpSessionState_BGP_SESSION_STATE_ESTABLISHED ||
		w.GetFamilies()[0].GetAddressFamily() != weirv1.AddressFamily_ADDRESS_FAMILY_IPV4 || w.GetFamilies()[1].GetAddressFamily() != weirv1.AddressFamily_ADDRESS_FAMILY_IPV6 {
		t.Errorf("encoded %v, want the enums established, ipv4, ipv6", w)
	}
}

package main

import (
	"testing"

	"google.golang.org/protobuf/proto"

	weirv1 "github.com/weirlb/weir/proto/weir/v1"
)

// checkFields refuses, before anything is sent, a port out of range or an
// address that does not parse, wherever it is nested, with the server's
// path; what is optional (a port of 0 other than a service's, a BGP
// peer's port) or the server's to check (a pool's addresses) passes.
func TestCheckFieldsFindsBadPortsAndAddresses(t *testing.T) {
	svc := func(edit func(*weirv1.ServiceSpec)) proto.Message {
		spec := &weirv1.ServiceSpec{ClusterIps: []string{"10.96.0.10"}, ExternalIps: []string{"192.0.2.1"},
			LoadBalancerSourceRanges: []string{"198.51.100.0/24"},
			Ports:                    []*weirv1.ServicePort{{Name: "http", Port: 80}, {Name: "dns", Port: 53, TargetPort: 5353}}}
		if edit != nil {
			edit(spec)
		}
		return &weirv1.Service{Metadata: &weirv1.ObjectMeta{Name: "web"}, Spec: spec}
	}
	for _, tc := range []struct {
		what string
		msg  proto.Message
		want string // "" for none
	}{
		{"a good service", svc(nil), ""},
		{"a service port of 0", svc(func(s *weirv1.ServiceSpec) { s.Ports[1].Port = 0 }), "spec.ports[1].port: 0 is not a port (1-65535)"},
		{"a target port out of range", svc(func(s *weirv1.ServiceSpec) { s.Ports[1].TargetPort = 65536 }), "spec.ports[1].target_port: 65536 is not a port (1-65535)"},
		{"a negative node port", svc(func(s *weirv1.ServiceSpec) { s.Ports[0].NodePort = -1 }), "spec.ports[0].node_port: -1 is not a port (1-65535)"},
		{"a health-check node port out of range", svc(func(s *weirv1.ServiceSpec) { s.HealthCheckNodePort = 70000 }), "spec.health_check_node_port: 70000 is not a port (1-65535)"},
		{"a bad external IP", svc(func(s *weirv1.ServiceSpec) { s.ExternalIps = append(s.ExternalIps, "192.0.2") }), `spec.external_ips[1]: "192.0.2" is not an IP address`},
		{"a bad source range", svc(func(s *weirv1.ServiceSpec) { s.LoadBalancerSourceRanges = []string{"198.51.100.0"} }), `spec.load_balancer_source_ranges[0]: "198.51.100.0" is not a CIDR`},
		{"the first fault, in field order", svc(func(s *weirv1.ServiceSpec) { s.ClusterIps[0] = "x"; s.Ports[0].Port = 0 }), `spec.cluster_ips[0]: "x" is not an IP address`},
		{"a BGP peer on port 0 (179)", &weirv1.BgpPeer{Metadata: &weirv1.ObjectMeta{Name: "tor"}, Address: "192.0.2.254"}, ""},
		{"a BGP peer on a port out of range", &weirv1.BgpPeer{Metadata: &weirv1.ObjectMeta{Name: "tor"}, Address: "192.0.2.254", Port: 65536}, "port: 65536 is not a port (1-65535)"},
		{"a pool's range", &weirv1.AddressPool{Metadata: &weirv1.ObjectMeta{Name: "p"}, Addresses: []string{"203.0.113.10-203.0.113.20"}}, ""},
	} {
		err := checkFields(tc.msg.ProtoReflect(), "")
		if got := errString(err); got != tc.want {
			t.Errorf("%s: %q; want %q", tc.what, got, tc.want)
		}
	}
}

func errString(err error) string {
	if err == nil {
		return ""
	}
	return err.Error()
}

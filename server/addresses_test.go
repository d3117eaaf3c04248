package server_test

import (
	"context"
	"net/netip"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/fieldmaskpb"

	weirv1 "github.com/weirlb/weir/proto/weir/v1"
	"github.com/weirlb/weir/server"
	"github.com/weirlb/weir/server/registry"
	"github.com/weirlb/weir/server/servertest"
)

// allowExternal is a server option: external IPs (and status addresses no
// pool holds) may come from cidrs, as weir-server --allowed-external-ip-cidrs.
func allowExternal(cidrs ...string) func(*server.Config) {
	return withRules(func(r *registry.ServiceRules) {
		for _, c := range cidrs {
			r.ExternalIPCIDRs = append(r.ExternalIPCIDRs, netip.MustParsePrefix(c))
		}
	})
}

// withRules is a server option: the default service rules, edited.
func withRules(edit func(*registry.ServiceRules)) func(*server.Config) {
	return func(c *server.Config) {
		rules := registry.DefaultServiceRules()
		edit(&rules)
		c.ServiceRules = &rules
	}
}

// wantInvalid fails unless err is InvalidArgument on field, saying says.
func wantInvalid(t *testing.T, what string, err error, field, says string) {
	t.Helper()
	st := status.Convert(err)
	if st.Code() != codes.InvalidArgument || !strings.HasPrefix(st.Message(), field+":") || !strings.Contains(st.Message(), says) {
		t.Errorf("%s: %v %q; want InvalidArgument on %s saying %q", what, st.Code(), st.Message(), field, says)
	}
}

// A load-balancer IP in a service's status takes the address's traffic on
// every node, as an external IP does: it comes from an address pool or the
// allowed external-IP CIDRs, and is never the server's or a node's own
// address, nor in a service range (CVE-2020-8554's capture, through
// status). The rule holds on a create and on an update that writes the
// status; a refusal names the field and changes nothing. An external IP is
// never a host's own address either, whatever the allowed CIDRs hold.
func TestFrontendAddressesNeverTakeAHost(t *testing.T) {
	ts := servertest.Start(t, t.TempDir(), withRules(func(r *registry.ServiceRules) {
		r.ServerAddrs = []netip.Addr{netip.MustParseAddr("10.77.0.1")}
		r.ExternalIPCIDRs = []netip.Prefix{netip.MustParsePrefix("198.51.100.0/24"), netip.MustParsePrefix("10.77.0.0/24")}
	}))
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if _, err := ts.Registry.CreateAddressPool(ctx, &weirv1.CreateAddressPoolRequest{AddressPool: &weirv1.AddressPool{
		Metadata: &weirv1.ObjectMeta{Name: "public"}, Addresses: []string{"203.0.113.0/24"}}}); err != nil {
		t.Fatal(err)
	}
	if _, err := ts.Registry.CreateNode(ctx, &weirv1.CreateNodeRequest{Node: &weirv1.Node{
		Metadata: &weirv1.ObjectMeta{Name: "n1"}, Addresses: []string{"10.77.0.11"}}}); err != nil {
		t.Fatal(err)
	}
	lb := func(name, clusterIP string, status, external []string) *weirv1.Service {
		s := validService()
		s.Metadata.Name = name
		s.Spec.Type = weirv1.ServiceType_SERVICE_TYPE_LOAD_BALANCER
		s.Spec.ClusterIps, s.Spec.ExternalIps = []string{clusterIP}, external
		s.Spec.Ports[0].NodePort = 0
		s.Status = &weirv1.ServiceStatus{LoadBalancerIps: status}
		return s
	}
	// One that holds, to update with each address.
	held, err := ts.Registry.CreateService(ctx, &weirv1.CreateServiceRequest{Service: lb("held", "10.96.0.9", []string{"203.0.113.9"}, nil)})
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name             string
		status, external []string
		field, says      string // "" when taken
	}{
		{"the server's own address", []string{"10.77.0.1"}, nil, "service.status.load_balancer_ips[0]", "an address of weir-server"},
		{"a node's address", []string{"10.77.0.11"}, nil, "service.status.load_balancer_ips[0]", "an address of node n1"},
		{"an address of the service range", []string{"10.96.0.50"}, nil, "service.status.load_balancer_ips[0]", "service range 10.96.0.0/12"},
		{"an address of no pool and not allowed", []string{"192.0.2.50"}, nil, "service.status.load_balancer_ips[0]", "in no address pool"},
		{"the second address a node's", []string{"203.0.113.20", "10.77.0.11"}, nil, "service.status.load_balancer_ips[1]", "node n1"},
		{"an external IP of the server, though allowed", nil, []string{"10.77.0.1"}, "service.spec.external_ips[0]", "an address of weir-server"},
		{"an external IP of a node, though allowed", nil, []string{"10.77.0.11"}, "service.spec.external_ips[0]", "an address of node n1"},
		{"an address of a pool", []string{"203.0.113.20"}, nil, "", ""},
		{"an allowed address", []string{"198.51.100.20"}, nil, "", ""},
		{"an allowed external IP", nil, []string{"198.51.100.21"}, "", ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := ts.Registry.CreateService(ctx, &weirv1.CreateServiceRequest{Service: lb("x", "10.96.0.20", tc.status, tc.external)})
			if tc.field == "" {
				if err != nil {
					t.Fatalf("refused: %v", err)
				}
				if _, err := ts.Registry.DeleteService(ctx, &weirv1.DeleteServiceRequest{Namespace: "default", Name: "x"}); err != nil {
					t.Fatal(err)
				}
				return
			}
			wantInvalid(t, "create", err, tc.field, tc.says)
			if _, err := ts.Registry.GetService(ctx, &weirv1.GetServiceRequest{Namespace: "default", Name: "x"}); status.Code(err) != codes.NotFound {
				t.Errorf("the refused service was stored: %v", err)
			}
			// The same through an update of a service that holds.
			upd := proto.Clone(held.GetService()).(*weirv1.Service)
			upd.Status.LoadBalancerIps, upd.Spec.ExternalIps = tc.status, tc.external
			req := &weirv1.UpdateServiceRequest{Service: upd}
			if tc.status != nil {
				req.UpdateMask = &fieldmaskpb.FieldMask{Paths: []string{"status.load_balancer_ips"}}
			}
			_, err = ts.Registry.UpdateService(ctx, req)
			wantInvalid(t, "update", err, tc.field, tc.says)
			got, err := ts.Registry.GetService(ctx, &weirv1.GetServiceRequest{Namespace: "default", Name: "held"})
			if err != nil || !proto.Equal(got.GetService().GetStatus(), held.GetService().GetStatus()) || len(got.GetService().GetSpec().GetExternalIps()) != 0 {
				t.Errorf("the refused update changed the service: %v, %v", got.GetService(), err)
			}
		})
	}

	// The other way: a node, or a service range, that would take a
	// service's load-balancer IP is refused.
	_, err = ts.Registry.CreateNode(ctx, &weirv1.CreateNodeRequest{Node: &weirv1.Node{
		Metadata: &weirv1.ObjectMeta{Name: "n2"}, Addresses: []string{"203.0.113.9"}}})
	wantInvalid(t, "a node on a load-balancer IP", err, "node.addresses[0]", "service default/held")
	_, err = ts.Registry.UpdateNode(ctx, &weirv1.UpdateNodeRequest{Node: &weirv1.Node{
		Metadata: &weirv1.ObjectMeta{Name: "n1"}, Addresses: []string{"10.77.0.11", "203.0.113.9"}}})
	wantInvalid(t, "a node updated onto a load-balancer IP", err, "node.addresses[1]", "service default/held")
	_, err = ts.Registry.CreateServiceCidr(ctx, &weirv1.CreateServiceCidrRequest{ServiceCidr: &weirv1.ServiceCidr{
		Metadata: &weirv1.ObjectMeta{Name: "more"}, Cidrs: []string{"203.0.113.0/24"}}})
	wantInvalid(t, "a service range holding a load-balancer IP", err, "service_cidr.cidrs[0]", "service default/held")
	if _, err := ts.Registry.GetNode(ctx, &weirv1.GetNodeRequest{Name: "n2"}); status.Code(err) != codes.NotFound {
		t.Errorf("the refused node was stored: %v", err)
	}
	if n1, err := ts.Registry.GetNode(ctx, &weirv1.GetNodeRequest{Name: "n1"}); err != nil || len(n1.GetNode().GetAddresses()) != 1 {
		t.Errorf("the refused update changed node n1: %v, %v", n1.GetNode(), err)
	}
	if _, err := ts.Registry.GetServiceCidr(ctx, &weirv1.GetServiceCidrRequest{Name: "more"}); status.Code(err) != codes.NotFound {
		t.Errorf("the refused service range was stored: %v", err)
	}
}

// A service range gives no service its network address, nor in IPv4 its
// broadcast address, nor in IPv6 its first (subnet-router anycast)
// address, as Kubernetes' allocator; the range's other addresses, the
// last IPv6 one among them, are cluster IPs.
func TestClusterIPsAreNeverARangesReservedAddresses(t *testing.T) {
	ts := startServer(t, t.TempDir())
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := ts.Registry.CreateServiceCidr(ctx, &weirv1.CreateServiceCidrRequest{ServiceCidr: &weirv1.ServiceCidr{
		Metadata: &weirv1.ObjectMeta{Name: "more"}, Cidrs: []string{"10.200.0.0/16"}}}); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		clusterIP, says string // says: "" when taken
	}{
		{"10.96.0.0", "the network address of the service range 10.96.0.0/12"},
		{"10.111.255.255", "the broadcast address of the service range 10.96.0.0/12"},
		{"fd00:96::", "the subnet-router anycast address of the service range fd00:96::/108"},
		{"10.200.0.0", "the network address of the service range 10.200.0.0/16"},
		{"10.200.255.255", "the broadcast address of the service range 10.200.0.0/16"},
		{"10.96.0.1", ""},
		{"10.111.255.254", ""},
		{"fd00:96::f:ffff", ""},
		{"10.200.255.254", ""},
	} {
		t.Run(tc.clusterIP, func(t *testing.T) {
			svc := validService()
			svc.Spec.ClusterIps = []string{tc.clusterIP}
			_, err := ts.Registry.CreateService(ctx, &weirv1.CreateServiceRequest{Service: svc})
			if tc.says == "" {
				if err != nil {
					t.Fatalf("refused: %v", err)
				}
				if _, err := ts.Registry.DeleteService(ctx, &weirv1.DeleteServiceRequest{Namespace: "default", Name: "web"}); err != nil {
					t.Fatal(err)
				}
				return
			}
			wantInvalid(t, tc.clusterIP, err, "service.spec.cluster_ips[0]", tc.says)
			if _, err := ts.Registry.GetService(ctx, &weirv1.GetServiceRequest{Namespace: "default", Name: "web"}); status.Code(err) != codes.NotFound {
				t.Errorf("the refused service was stored: %v", err)
			}
		})
	}
}

// A service range is as wide as Kubernetes lets one be at most: 2^20
// IPv4 addresses (/12), an IPv6 /64; a wider one is refused by rule,
// whatever addresses it holds, since every node drops new connections to
// its free addresses.
func TestServiceCIDRWidthIsBounded(t *testing.T) {
	ts := startServer(t, t.TempDir())
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for _, tc := range []struct {
		cidrs       []string
		field, says string // "" when taken
	}{
		{[]string{"10.0.0.0/8"}, "service_cidr.cidrs[0]", "wider than /12"},
		{[]string{"10.64.0.0/11"}, "service_cidr.cidrs[0]", "wider than /12"},
		{[]string{"10.112.0.0/12", "fd00::/63"}, "service_cidr.cidrs[1]", "wider than /64"},
		{[]string{"10.112.0.0/12", "fd00:1::/64"}, "", ""},
	} {
		t.Run(strings.Join(tc.cidrs, ","), func(t *testing.T) {
			_, err := ts.Registry.CreateServiceCidr(ctx, &weirv1.CreateServiceCidrRequest{ServiceCidr: &weirv1.ServiceCidr{
				Metadata: &weirv1.ObjectMeta{Name: "wide"}, Cidrs: tc.cidrs}})
			if tc.field == "" {
				if err != nil {
					t.Fatalf("refused: %v", err)
				}
				return
			}
			wantInvalid(t, "create", err, tc.field, tc.says)
			if _, err := ts.Registry.GetServiceCidr(ctx, &weirv1.GetServiceCidrRequest{Name: "wide"}); status.Code(err) != codes.NotFound {
				t.Errorf("the refused range was stored: %v", err)
			}
		})
	}
}

package main

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"strconv"
	"strings"
	"time"

	v1 "k8s.io/api/core/v1"
	discovery "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/tools/events"
	proxyconfig "k8s.io/kubernetes/pkg/proxy/apis/config"
	"k8s.io/kubernetes/pkg/proxy/metrics"
	"k8s.io/kubernetes/pkg/proxy/nftables"
	proxyutil "k8s.io/kubernetes/pkg/proxy/util"
	"k8s.io/utils/ptr"
)

// programNode is -program-node: for test/bench/packetrate, the proxier
// syncs once, in the network namespace this runs in (a lab's node), the
// filler services of this bench and one node-port service per entry of
// ports ("tcp:30100:8000": protocol, node port, the pod's port), each
// with the one pod at pod, and exits: kube-proxy's table stays, as it
// does when kube-proxy stops.
func programNode(node, pod netip.Addr, ports string, fillers int) error {
	logs := logToStderr(0)
	metrics.RegisterMetrics(proxyconfig.ProxyModeNFTables)
	ctx := context.Background()
	proxier, err := nftables.NewProxier(ctx, v1.IPv4Protocol, time.Hour, 0, false, 14,
		proxyutil.NewDetectLocalByCIDR(clusterCIDR), nodeName, net.IP(node.AsSlice()),
		&events.FakeRecorder{}, nil, []string{node.String() + "/32"}, false)
	if err != nil {
		return err
	}
	for i := range fillers {
		svc, slice := service(i)
		proxier.OnServiceAdd(svc)
		proxier.OnEndpointSliceAdd(slice)
	}
	for i, p := range strings.Split(ports, ",") {
		f := strings.Split(p, ":")
		if len(f) != 3 {
			return fmt.Errorf("-program-ports %q: want protocol:nodePort:podPort", p)
		}
		nodePort, err1 := strconv.Atoi(f[1])
		podPort, err2 := strconv.Atoi(f[2])
		if err1 != nil || err2 != nil {
			return fmt.Errorf("-program-ports %q: the ports are numbers", p)
		}
		svc, slice := nodePortService(i, v1.Protocol(strings.ToUpper(f[0])), int32(nodePort), int32(podPort), pod)
		proxier.OnServiceAdd(svc)
		proxier.OnEndpointSliceAdd(slice)
	}
	proxier.OnServiceCIDRsChanged([]string{serviceCIDR})
	proxier.OnServiceSynced()
	before, err := recordOf(logs)
	if err != nil {
		return err
	}
	proxier.OnEndpointSlicesSynced() // the one sync
	after, err := recordOf(logs)
	if err != nil {
		return err
	}
	return checkSync(before, after, true, true)
}

// nodePortService is a NodePort service (externalTrafficPolicy Cluster, as
// Weir's bench service) whose one endpoint is the pod on this node.
func nodePortService(i int, proto v1.Protocol, nodePort, podPort int32, pod netip.Addr) (*v1.Service, *discovery.EndpointSlice) {
	name := fmt.Sprintf("measured-%d", i)
	clusterIP := addr4(10, 95, 0, 1+i).String()
	svc := &v1.Service{
		ObjectMeta: metav1.ObjectMeta{Namespace: "bench", Name: name},
		Spec: v1.ServiceSpec{
			Type:                  v1.ServiceTypeNodePort,
			ClusterIP:             clusterIP,
			ClusterIPs:            []string{clusterIP},
			IPFamilies:            []v1.IPFamily{v1.IPv4Protocol},
			IPFamilyPolicy:        ptr.To(v1.IPFamilyPolicySingleStack),
			SessionAffinity:       v1.ServiceAffinityNone,
			ExternalTrafficPolicy: v1.ServiceExternalTrafficPolicyCluster,
			InternalTrafficPolicy: ptr.To(v1.ServiceInternalTrafficPolicyCluster),
			Ports: []v1.ServicePort{{
				Name: "p", Protocol: proto, Port: 80, TargetPort: intstr.FromInt32(podPort), NodePort: nodePort,
			}},
		},
	}
	slice := &discovery.EndpointSlice{
		ObjectMeta: metav1.ObjectMeta{
			Namespace: "bench", Name: name + "-bench",
			Labels: map[string]string{discovery.LabelServiceName: name},
		},
		AddressType: discovery.AddressTypeIPv4,
		Ports:       []discovery.EndpointPort{{Name: ptr.To("p"), Protocol: ptr.To(proto), Port: ptr.To(podPort)}},
		Endpoints: []discovery.Endpoint{{
			Addresses: []string{pod.String()},
			NodeName:  ptr.To(nodeName),
			Conditions: discovery.EndpointConditions{
				Ready: ptr.To(true), Serving: ptr.To(true), Terminating: ptr.To(false),
			},
		}},
	}
	return svc, slice
}

package convert

import (
	"strings"

	"sigs.k8s.io/yaml"

	weirv1 "github.com/weirlb/weir/proto/weir/v1"
)

// The custom resources' apiVersion and kinds, as the server's CRDs name
// them (server/kubernetes/api/v1alpha1; lbctl stays free of the
// Kubernetes libraries, and TestConvertedMetalLBIsAccepted applies this
// output to a real apiserver). The kinds carry Weir's name, so no
// kubectl name of them is also MetalLB's or Calico's.
const (
	crdAPIVersion      = "weir.dev/v1alpha1"
	crdAddressPoolKind = "WeirAddressPool"
	crdBGPPeerKind     = "WeirBGPPeer"
)

// CustomResources writes pools and peers as Weir's Kubernetes custom
// resources (weir.dev/v1alpha1 WeirAddressPool and WeirBGPPeer) for
// kubectl apply; a peer's password becomes a Secret in namespace (the
// server's), which the WeirBGPPeer names.
func CustomResources(pools []*weirv1.AddressPool, peers []*weirv1.BgpPeer, namespace string) (string, error) {
	return customResources(pools, peers, nil, namespace)
}

// CustomResources writes r as Weir's custom resources (CustomResources),
// a peer whose password MetalLB read from a Secret naming that Secret.
func (r *Result) CustomResources(namespace string) (string, error) {
	return customResources(r.Pools, r.Peers, r.PasswordSecrets, namespace)
}

// customResources writes pools and peers; secrets are the Secrets that
// hold peers' passwords, by peer name.
func customResources(pools []*weirv1.AddressPool, peers []*weirv1.BgpPeer, secrets map[string]SecretKeyRef, namespace string) (string, error) {
	var docs []any
	for _, p := range pools {
		spec := map[string]any{"addresses": p.GetAddresses()}
		if p.GetManualOnly() {
			spec["autoAssign"] = false
		}
		set(spec, "avoidBuggyIPs", true, p.GetAvoidBuggyIps())
		if b := p.GetBgpAdvertisement(); b != nil {
			spec["bgpAdvertisement"] = advertisementResource(b)
		}
		if advs := p.GetBgpAdvertisements(); len(advs) > 0 {
			var list []any
			for _, b := range advs {
				list = append(list, advertisementResource(b))
			}
			spec["bgpAdvertisements"] = list
		}
		if l := p.GetL2Advertisement(); l != nil {
			adv := map[string]any{}
			set(adv, "interfaces", l.GetInterfaces(), len(l.GetInterfaces()) > 0)
			set(adv, "nodeSelector", l.GetNodeSelector(), len(l.GetNodeSelector()) > 0)
			set(adv, "serviceSelector", l.GetServiceSelector(), len(l.GetServiceSelector()) > 0)
			spec["l2Advertisement"] = adv
		}
		if a := p.GetServiceAllocation(); a != nil {
			alloc := map[string]any{}
			set(alloc, "priority", a.GetPriority(), a.GetPriority() != 0)
			set(alloc, "namespaces", a.GetNamespaces(), len(a.GetNamespaces()) > 0)
			set(alloc, "serviceSelector", a.GetServiceSelector(), len(a.GetServiceSelector()) > 0)
			set(alloc, "namespaceSelector", a.GetNamespaceSelector(), len(a.GetNamespaceSelector()) > 0)
			spec["serviceAllocation"] = alloc
		}
		docs = append(docs, customResource(crdAddressPoolKind, p.GetMetadata(), spec))
	}
	for _, p := range peers {
		spec := map[string]any{"myASN": p.GetMyAsn()}
		set(spec, "address", p.GetAddress(), p.GetAddress() != "")
		set(spec, "interface", p.GetInterface(), p.GetInterface() != "")
		set(spec, "asn", p.GetAsn(), p.GetAsn() != 0)
		set(spec, "dynamicASN", p.GetDynamicAsn(), p.GetDynamicAsn() != "")
		set(spec, "vrf", p.GetVrf(), p.GetVrf() != "")
		set(spec, "port", p.GetPort(), p.GetPort() != 0)
		set(spec, "holdTimeSeconds", p.GetHoldTimeSeconds(), p.GetHoldTimeSeconds() != 0)
		set(spec, "nodeSelector", p.GetNodeSelector(), len(p.GetNodeSelector()) > 0)
		set(spec, "gracefulRestart", true, p.GetGracefulRestart())
		set(spec, "ebgpMultihopTTL", p.GetEbgpMultihopTtl(), p.GetEbgpMultihopTtl() != 0)
		set(spec, "sourceAddress", p.GetSourceAddress(), p.GetSourceAddress() != "")
		set(spec, "keepaliveSeconds", p.GetKeepaliveSeconds(), p.GetKeepaliveSeconds() != 0)
		set(spec, "connectRetrySeconds", p.GetConnectRetrySeconds(), p.GetConnectRetrySeconds() != 0)
		if p.GetPassword() != "" {
			secret := p.GetMetadata().GetName() + "-bgp-password"
			docs = append(docs, map[string]any{"apiVersion": "v1", "kind": "Secret",
				"metadata":   map[string]any{"name": secret, "namespace": namespace},
				"stringData": map[string]string{"password": p.GetPassword()}})
			spec["passwordSecretRef"] = map[string]any{"name": secret}
		} else if ref, ok := secrets[p.GetMetadata().GetName()]; ok {
			spec["passwordSecretRef"] = ref
		}
		docs = append(docs, customResource(crdBGPPeerKind, p.GetMetadata(), spec))
	}
	var out []string
	for _, d := range docs {
		b, err := yaml.Marshal(d)
		if err != nil {
			return "", err
		}
		out = append(out, string(b))
	}
	return strings.Join(out, "---\n"), nil
}

func set(m map[string]any, key string, v any, ok bool) {
	if ok {
		m[key] = v
	}
}

func customResource(kind string, meta *weirv1.ObjectMeta, spec map[string]any) map[string]any {
	md := map[string]any{"name": meta.GetName()}
	if len(meta.GetLabels()) > 0 {
		md["labels"] = meta.GetLabels()
	}
	return map[string]any{"apiVersion": crdAPIVersion, "kind": kind, "metadata": md, "spec": spec}
}

// advertisementResource is one BGP advertisement as the custom resource
// writes it.
func advertisementResource(b *weirv1.BgpAdvertisement) map[string]any {
	adv := map[string]any{}
	set(adv, "communities", b.GetCommunities(), len(b.GetCommunities()) > 0)
	set(adv, "localPreference", b.GetLocalPreference(), b.GetLocalPreference() != 0)
	set(adv, "peers", b.GetPeers(), len(b.GetPeers()) > 0)
	set(adv, "aggregationLength", b.GetAggregationLength(), b.GetAggregationLength() != 0)
	set(adv, "aggregationLengthV6", b.GetAggregationLengthV6(), b.GetAggregationLengthV6() != 0)
	set(adv, "maxAnnouncingNodes", b.GetMaxAnnouncingNodes(), b.GetMaxAnnouncingNodes() != 0)
	set(adv, "nodeSelector", b.GetNodeSelector(), len(b.GetNodeSelector()) > 0)
	set(adv, "serviceSelector", b.GetServiceSelector(), len(b.GetServiceSelector()) > 0)
	return adv
}

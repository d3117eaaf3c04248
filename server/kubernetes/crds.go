package kubernetes

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/dynamic/dynamicinformer"
	"k8s.io/client-go/tools/cache"

	weirv1 "github.com/weirlb/weir/proto/weir/v1"
	"github.com/weirlb/weir/server/kubernetes/api/v1alpha1"
	"github.com/weirlb/weir/server/model"
	"github.com/weirlb/weir/server/registry"
	"github.com/weirlb/weir/server/resourcewire"
)

// crds mirrors Weir's custom resources (weir.dev WeirAddressPools and
// WeirBGPPeers) into the registry, through the same conversion and validation
// as the native API, and remembers why one was refused, for its status.
type crds struct {
	dyn       dynamic.Interface
	namespace string // where peers' password Secrets are
	src       *Source
	factory   dynamicinformer.DynamicSharedInformerFactory

	mu      sync.Mutex
	refused map[string]error // "weiraddresspools/NAME": why the registry does not hold it
}

// crdsServed says whether the cluster has Weir's CRDs installed. Any
// other answer than yes or no is an error: going on without the pools the
// cluster declares would take addresses away.
func (s *Source) crdsServed() (bool, error) {
	list, err := s.client.Discovery().ServerResourcesForGroupVersion(v1alpha1.GroupVersion.String())
	switch {
	case apierrors.IsNotFound(err):
		s.log.Info("weir.dev custom resources not watched: their CRDs are not installed (install them, then restart the server)")
		return false, nil
	case err != nil:
		return false, fmt.Errorf("asking whether the weir.dev CRDs are installed: %w", err)
	}
	return len(list.APIResources) > 0, nil
}

func (c *crds) makeInformers() ([]cache.InformerSynced, error) {
	c.factory = dynamicinformer.NewDynamicSharedInformerFactory(c.dyn, c.src.cfg.Resync)
	var synced []cache.InformerSynced
	for _, gvr := range []schema.GroupVersionResource{v1alpha1.AddressPools, v1alpha1.BGPPeers} {
		inf := c.factory.ForResource(gvr).Informer()
		h, err := inf.AddEventHandler(cache.ResourceEventHandlerFuncs{
			AddFunc:    func(obj any) { c.upsert(obj) },
			UpdateFunc: func(_, obj any) { c.upsert(obj) },
			DeleteFunc: c.remove,
		})
		if err != nil {
			return nil, err
		}
		synced = append(synced, h.HasSynced)
	}
	return synced, nil
}

// RetryPeriod is how often refused custom resources are read again: what
// refused one may have changed without it (a password Secret created, an
// overlapping pool deleted).
var RetryPeriod = 5 * time.Second

// retry reads the refused custom resources again every RetryPeriod until
// ctx ends.
func (c *crds) retry(ctx context.Context) {
	t := time.NewTicker(RetryPeriod)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		c.mu.Lock()
		keys := make([]string, 0, len(c.refused))
		for k := range c.refused {
			keys = append(keys, k)
		}
		c.mu.Unlock()
		for _, k := range keys {
			resource, name, _ := strings.Cut(k, "/")
			obj, ok, err := c.factory.ForResource(v1alpha1.GroupVersion.WithResource(resource)).Informer().GetStore().GetByKey(name)
			if err == nil && ok {
				c.upsert(obj)
			}
		}
	}
}

// Refused is why the registry does not hold the custom resource
// (resource "weiraddresspools" or "weirbgppeers"), or nil.
func (c *crds) Refused(resource, name string) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.refused[resource+"/"+name]
}

// setRefused records why key is refused (nil: it is not), and tells
// whether that is news.
func (c *crds) setRefused(key string, err error) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	old := c.refused[key]
	if err == nil {
		delete(c.refused, key)
	} else {
		c.refused[key] = err
	}
	return (old == nil) != (err == nil) || (err != nil && old.Error() != err.Error())
}

func (c *crds) upsert(obj any) {
	u, ok := obj.(*unstructured.Unstructured)
	if !ok {
		return
	}
	var err error
	var key string
	switch u.GetKind() {
	case v1alpha1.AddressPoolKind:
		key = v1alpha1.AddressPools.Resource + "/" + u.GetName()
		var p v1alpha1.WeirAddressPool
		if err = runtime.DefaultUnstructuredConverter.FromUnstructured(u.Object, &p); err == nil {
			var m *model.AddressPool
			if m, err = PoolFromCRD(&p); err == nil {
				if err = specField(put(c.src.reg.Pools, m)); err == nil {
					c.refuseDisplaced()
				}
			}
		}
	case v1alpha1.BGPPeerKind:
		key = v1alpha1.BGPPeers.Resource + "/" + u.GetName()
		var p v1alpha1.WeirBGPPeer
		if err = runtime.DefaultUnstructuredConverter.FromUnstructured(u.Object, &p); err == nil {
			var m *model.BGPPeer
			if m, err = c.peer(&p); err == nil {
				err = specField(put(c.src.reg.Peers, m))
			}
		}
	default:
		return
	}
	if c.setRefused(key, err) && err != nil {
		c.src.log.Warn("custom resource not taken", "resource", key, "error", err)
	}
}

func (c *crds) remove(obj any) {
	if d, ok := obj.(cache.DeletedFinalStateUnknown); ok {
		obj = d.Obj
	}
	u, ok := obj.(*unstructured.Unstructured)
	if !ok {
		return
	}
	var err error
	switch u.GetKind() {
	case v1alpha1.AddressPoolKind:
		c.setRefused(v1alpha1.AddressPools.Resource+"/"+u.GetName(), nil)
		err = c.src.delete(c.src.reg.Pools, u.GetName())
	case v1alpha1.BGPPeerKind:
		c.setRefused(v1alpha1.BGPPeers.Resource+"/"+u.GetName(), nil)
		err = c.src.delete(c.src.reg.Peers, u.GetName())
	}
	// One of that name that another source owns (the resources file's)
	// stays, and is no news.
	if err != nil && !errors.Is(err, registry.ErrInUse) {
		c.src.log.Warn("custom resource's deletion not mirrored", "name", u.GetName(), "error", err)
	}
}

// PoolFromCRD is the registry's pool for a WeirAddressPool, read and checked
// as the native API reads its own.
func PoolFromCRD(p *v1alpha1.WeirAddressPool) (*model.AddressPool, error) {
	w := &weirv1.AddressPool{Metadata: &weirv1.ObjectMeta{Name: p.Name, Labels: p.Labels}, Addresses: p.Spec.Addresses,
		ManualOnly: p.Spec.AutoAssign != nil && !*p.Spec.AutoAssign, AvoidBuggyIps: p.Spec.AvoidBuggyIPs}
	if b := p.Spec.BGPAdvertisement; b != nil {
		w.BgpAdvertisement = advertisementFromCRD(b)
	}
	for i := range p.Spec.BGPAdvertisements {
		w.BgpAdvertisements = append(w.BgpAdvertisements, advertisementFromCRD(&p.Spec.BGPAdvertisements[i]))
	}
	if l := p.Spec.L2Advertisement; l != nil {
		w.L2Advertisement = &weirv1.L2Advertisement{Interfaces: l.Interfaces, NodeSelector: l.NodeSelector, ServiceSelector: l.ServiceSelector}
	}
	if a := p.Spec.ServiceAllocation; a != nil {
		w.ServiceAllocation = &weirv1.ServiceAllocation{Priority: a.Priority, Namespaces: a.Namespaces, ServiceSelector: a.ServiceSelector,
			NamespaceSelector: a.NamespaceSelector}
	}
	m, err := resourcewire.PoolFromProto(w)
	if err != nil {
		return nil, specField(err)
	}
	m.Source, m.CreateTime = model.SourceKubernetes, p.CreationTimestamp.UTC()
	return m, nil
}

// advertisementFromCRD is the API's form of one BGP advertisement of a
// WeirAddressPool.
func advertisementFromCRD(b *v1alpha1.BGPAdvertisement) *weirv1.BgpAdvertisement {
	return &weirv1.BgpAdvertisement{Communities: b.Communities, LocalPreference: b.LocalPreference, Peers: b.Peers,
		AggregationLength: uint32(b.AggregationLength), AggregationLengthV6: uint32(b.AggregationLengthV6), MaxAnnouncingNodes: uint32(b.MaxAnnouncingNodes),
		NodeSelector: b.NodeSelector, ServiceSelector: b.ServiceSelector}
}

// peer is the registry's peer for a WeirBGPPeer, its password read from its
// Secret.
func (c *crds) peer(p *v1alpha1.WeirBGPPeer) (*model.BGPPeer, error) {
	w := &weirv1.BgpPeer{Metadata: &weirv1.ObjectMeta{Name: p.Name, Labels: p.Labels}, Address: p.Spec.Address,
		Asn: uint32(p.Spec.ASN), MyAsn: uint32(p.Spec.MyASN), Port: p.Spec.Port, HoldTimeSeconds: p.Spec.HoldTimeSeconds,
		NodeSelector: p.Spec.NodeSelector, GracefulRestart: p.Spec.GracefulRestart,
		EbgpMultihopTtl: uint32(p.Spec.EBGPMultihopTTL), SourceAddress: p.Spec.SourceAddress,
		KeepaliveSeconds: p.Spec.KeepaliveSeconds, ConnectRetrySeconds: p.Spec.ConnectRetrySeconds,
		Interface: p.Spec.Interface, DynamicAsn: p.Spec.DynamicASN, Vrf: p.Spec.VRF}
	if b := p.Spec.BFD; b != nil {
		// The CRD's schema bounds each number, so none turns negative.
		w.Bfd = &weirv1.BfdProfile{ReceiveIntervalMs: uint32(b.ReceiveInterval), TransmitIntervalMs: uint32(b.TransmitInterval),
			DetectMultiplier: uint32(b.DetectMultiplier), Passive: b.PassiveMode, MinimumTtl: uint32(b.MinimumTTL)}
	}
	if ref := p.Spec.PasswordSecretRef; ref != nil {
		key := ref.Key
		if key == "" {
			key = "password"
		}
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		sec, err := c.src.client.CoreV1().Secrets(c.namespace).Get(ctx, ref.Name, metav1.GetOptions{})
		switch {
		case apierrors.IsNotFound(err):
			return nil, fmt.Errorf("spec.passwordSecretRef: no Secret %s/%s", c.namespace, ref.Name)
		case err != nil:
			return nil, fmt.Errorf("spec.passwordSecretRef: Secret %s/%s: %w", c.namespace, ref.Name, err)
		}
		pw, ok := sec.Data[key]
		if !ok {
			return nil, fmt.Errorf("spec.passwordSecretRef: Secret %s/%s has no key %q", c.namespace, ref.Name, key)
		}
		w.Password = string(pw)
	}
	m, err := resourcewire.BGPPeerFromProto(w)
	if err != nil {
		return nil, specField(err)
	}
	m.Source, m.CreateTime = model.SourceKubernetes, p.CreationTimestamp.UTC()
	return m, nil
}

// specField names a field error as the custom resource spells it: under
// spec, as the native API's name ("spec.addresses[2]: ...").
func specField(err error) error {
	var fe *model.FieldError
	var overlap *registry.OverlapError
	switch {
	case errors.As(err, &fe):
		return fmt.Errorf("spec.%s: %s", fe.Field, fe.Reason)
	case errors.As(err, &overlap):
		return fmt.Errorf("spec.addresses[%d]: %s overlaps pool %s", overlap.Index, overlap.Range, overlap.Pool)
	}
	return err
}

// present adds the custom resources the informers hold to present, as
// removeGone keys them.
func (c *crds) present(present map[string]bool) {
	for _, r := range []string{v1alpha1.AddressPools.Resource, v1alpha1.BGPPeers.Resource} {
		for _, o := range c.factory.ForResource(v1alpha1.GroupVersion.WithResource(r)).Informer().GetStore().List() {
			present[r+"/"+o.(*unstructured.Unstructured).GetName()] = true
		}
	}
}

// removeGone deletes the registry's kubernetes-owned pools and peers that
// the cluster no longer has.
func (c *crds) removeGone(present map[string]bool) {
	pools, _ := c.src.reg.Pools.List("", nil)
	for _, p := range pools {
		if p.Source == model.SourceKubernetes && !present[v1alpha1.AddressPools.Resource+"/"+p.Name] {
			c.src.delete(c.src.reg.Pools, p.Name)
		}
	}
	peers, _ := c.src.reg.Peers.List("", nil)
	for _, p := range peers {
		if p.Source == model.SourceKubernetes && !present[v1alpha1.BGPPeers.Resource+"/"+p.Name] {
			c.src.delete(c.src.reg.Peers, p.Name)
		}
	}
}

// CustomPools and CustomPeers are the custom resources the cluster has
// now (copies of the informers' objects), nil without them.
func (s *Source) CustomPools() []*v1alpha1.WeirAddressPool {
	return custom[v1alpha1.WeirAddressPool](s, v1alpha1.AddressPools.Resource)
}

func (s *Source) CustomPeers() []*v1alpha1.WeirBGPPeer {
	return custom[v1alpha1.WeirBGPPeer](s, v1alpha1.BGPPeers.Resource)
}

// custom reads the informer's objects of resource as T.
func custom[T any](s *Source, resource string) []*T {
	if s.crds == nil || s.crds.factory == nil {
		return nil
	}
	var out []*T
	for _, o := range s.crds.factory.ForResource(v1alpha1.GroupVersion.WithResource(resource)).Informer().GetStore().List() {
		p := new(T)
		if runtime.DefaultUnstructuredConverter.FromUnstructured(o.(*unstructured.Unstructured).Object, p) == nil {
			out = append(out, p)
		}
	}
	return out
}

// CustomRefused is why the registry does not hold a custom resource
// (resource "weiraddresspools" or "weirbgppeers"), or nil.
func (s *Source) CustomRefused(resource, name string) error {
	if s.crds == nil {
		return nil
	}
	return s.crds.Refused(resource, name)
}

// WriteCustomStatus writes status (an *AddressPoolStatus or a
// *BGPPeerStatus) to the custom resource obj, the informer's copy, through
// its status subresource.
func (s *Source) WriteCustomStatus(ctx context.Context, resource string, obj metav1.Object, status any) error {
	if s.crds == nil {
		return errors.New("no custom resources")
	}
	st, err := runtime.DefaultUnstructuredConverter.ToUnstructured(status)
	if err != nil {
		return err
	}
	u := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": v1alpha1.GroupVersion.String(),
		"metadata":   map[string]any{"name": obj.GetName(), "resourceVersion": obj.GetResourceVersion(), "uid": string(obj.GetUID())},
		"status":     st,
	}}
	switch resource {
	case v1alpha1.AddressPools.Resource:
		u.SetKind(v1alpha1.AddressPoolKind)
	case v1alpha1.BGPPeers.Resource:
		u.SetKind(v1alpha1.BGPPeerKind)
	}
	_, err = s.crds.dyn.Resource(v1alpha1.GroupVersion.WithResource(resource)).UpdateStatus(ctx, u, metav1.UpdateOptions{})
	return err
}

// Package kubernetes is the server's Kubernetes source: client-go informers
// on Services, EndpointSlices, Nodes and ServiceCIDRs, with kube-proxy's
// label selectors, mirrored into the registry as resources owned by the
// "kubernetes" source.
package kubernetes

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/selection"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/informers"
	clientset "k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/weirlb/weir/server/kubernetes/api/v1alpha1"
	"github.com/weirlb/weir/server/model"
	"github.com/weirlb/weir/server/registry"
)

// Config is how the source watches a cluster.
type Config struct {
	// Kubeconfig is a kubeconfig file; empty means the in-cluster config.
	Kubeconfig string
	// ProxyName, when set, selects only services labelled
	// service.kubernetes.io/service-proxy-name=ProxyName; when empty, only
	// services without that label (kube-proxy's own rule).
	ProxyName string
	// Classes says which LoadBalancer services Weir assigns addresses to
	// and announces; the nodes forward every service's addresses.
	Classes Classes
	// Dynamic, when not nil, reads Weir's custom resources (weir.dev
	// WeirAddressPools and WeirBGPPeers) where their CRDs are installed, and
	// Namespace is where WeirBGPPeers' password Secrets are.
	Dynamic   dynamic.Interface
	Namespace string
	// Resync is the informers' resync period; 0 disables it.
	Resync time.Duration
	// LeaderElection, when not nil, lets several server replicas mirror
	// the cluster, each into its own registry, with only the holder of a
	// Lease writing back to the cluster (the server's concern: the source
	// itself runs on every replica).
	LeaderElection *LeaderElection
	// AgentTokens say which tokens bind agents on the shared certificate
	// to their nodes (NodeTokens).
	AgentTokens AgentTokens
	Log         *slog.Logger
}

// RestConfig loads the client configuration cfg names.
func RestConfig(kubeconfig string) (*rest.Config, error) {
	if kubeconfig == "" {
		return rest.InClusterConfig()
	}
	return clientcmd.BuildConfigFromFlags("", kubeconfig)
}

// Source mirrors a cluster into the registry.
type Source struct {
	cfg    Config
	reg    *registry.Registry
	client clientset.Interface
	log    *slog.Logger
	// synced are the event handlers' HasSynced: true once each has
	// handled every object of its informer's first list (an informer's
	// own HasSynced can be true before its handler has seen them).
	synced []cache.InformerSynced
	// syncedMu guards listed, closed when this run's handlers have all
	// synced, and replaced by an open one when the run ends.
	syncedMu sync.Mutex
	listed   chan struct{}
	factory  informers.SharedInformerFactory
	// nodes holds the informers without a label selector: nodes and
	// service CIDRs.
	nodes informers.SharedInformerFactory
	// serviceCIDRs is true when the cluster serves ServiceCIDR objects.
	serviceCIDRs bool
	// crds mirrors Weir's custom resources; nil without them.
	crds *crds
	// selector picks the services and slices Weir handles.
	selector string
	// ran: Run ran before, and needs new informers.
	ran bool
}

// New prepares the informers; Run starts them.
func New(cfg Config, client clientset.Interface, reg *registry.Registry) (*Source, error) {
	if cfg.Log == nil {
		cfg.Log = slog.New(slog.DiscardHandler)
	}
	op := selection.DoesNotExist
	var vals []string
	if cfg.ProxyName != "" {
		op, vals = selection.Equals, []string{cfg.ProxyName}
	}
	proxyName, err := labels.NewRequirement(LabelServiceProxyName, op, vals)
	if err != nil {
		return nil, err
	}
	notHeadless, err := labels.NewRequirement(LabelHeadless, selection.DoesNotExist, nil)
	if err != nil {
		return nil, err
	}
	// One selector serves both: services never carry the headless label,
	// and slices carry the service's proxy-name label (the endpoint-slice
	// controller copies service labels).
	s := &Source{cfg: cfg, reg: reg, client: client, log: cfg.Log, listed: make(chan struct{}),
		selector: labels.NewSelector().Add(*proxyName, *notHeadless).String()}
	s.serviceCIDRsServed()
	if cfg.Dynamic != nil {
		served, err := s.crdsServed()
		if err != nil {
			return nil, err
		}
		if served {
			s.crds = &crds{dyn: cfg.Dynamic, namespace: cfg.Namespace, src: s, refused: map[string]error{}}
		}
	}
	if err := s.makeInformers(); err != nil {
		return nil, err
	}
	return s, nil
}

// makeInformers makes a fresh set of informers: a set that was shut down
// cannot start again, and a replica that leads again runs the source
// again.
func (s *Source) makeInformers() error {
	sel := s.selector
	s.synced = nil
	s.factory = informers.NewSharedInformerFactoryWithOptions(s.client, s.cfg.Resync,
		informers.WithTweakListOptions(func(o *metav1.ListOptions) { o.LabelSelector = sel }))
	s.nodes = informers.NewSharedInformerFactory(s.client, s.cfg.Resync)

	svcs := s.factory.Core().V1().Services().Informer()
	slices := s.factory.Discovery().V1().EndpointSlices().Informer()
	nodes := s.nodes.Core().V1().Nodes().Informer()
	// Namespaces for their labels, which pools' namespace selectors
	// select services by.
	namespaces := s.nodes.Core().V1().Namespaces().Informer()
	watched := []cache.SharedIndexInformer{svcs, slices, nodes, namespaces}
	if s.serviceCIDRs {
		watched = append(watched, s.nodes.Networking().V1().ServiceCIDRs().Informer())
	}
	for _, inf := range watched {
		h, err := inf.AddEventHandler(cache.ResourceEventHandlerFuncs{
			AddFunc:    func(obj any) { s.upsert(obj) },
			UpdateFunc: func(_, obj any) { s.upsert(obj) },
			DeleteFunc: s.remove,
		})
		if err != nil {
			return err
		}
		s.synced = append(s.synced, h.HasSynced)
	}
	if s.crds != nil {
		synced, err := s.crds.makeInformers()
		if err != nil {
			return err
		}
		s.synced = append(s.synced, synced...)
	}
	return nil
}

// serviceCIDRsServed says whether the cluster has ServiceCIDR objects
// (networking.k8s.io/v1, Kubernetes 1.33 and later); an older cluster's
// service range is the agents' --service-cidr alone.
func (s *Source) serviceCIDRsServed() bool {
	list, err := s.client.Discovery().ServerResourcesForGroupVersion(networkingv1.SchemeGroupVersion.String())
	if err != nil {
		s.log.Info("ServiceCIDRs not watched: the cluster does not serve them", "error", err)
		return false
	}
	for _, r := range list.APIResources {
		if r.Name == "servicecidrs" {
			s.serviceCIDRs = true
			return true
		}
	}
	s.log.Info("ServiceCIDRs not watched: the cluster does not serve them")
	return false
}

// Client is the source's Kubernetes client.
func (s *Source) Client() clientset.Interface { return s.client }

// Run watches until ctx ends. Once the informers have synced it removes
// what the registry holds from the cluster but the cluster no longer has.
func (s *Source) Run(ctx context.Context) error {
	if s.ran {
		if err := s.makeInformers(); err != nil {
			return err
		}
	}
	s.ran = true
	s.factory.Start(ctx.Done())
	s.nodes.Start(ctx.Done())
	if s.crds != nil {
		s.crds.factory.Start(ctx.Done())
		go s.crds.retry(ctx)
	}
	defer func() {
		s.factory.Shutdown()
		s.nodes.Shutdown()
		if s.crds != nil {
			s.crds.factory.Shutdown()
		}
		s.syncedMu.Lock()
		s.listed = make(chan struct{}) // the next run lists anew
		s.syncedMu.Unlock()
	}()
	if !cache.WaitForCacheSync(ctx.Done(), s.synced...) {
		return errors.New("kubernetes informers did not sync")
	}
	s.removeGone()
	s.syncedMu.Lock()
	close(s.listed)
	s.syncedMu.Unlock()
	s.log.Info("kubernetes source synced")
	<-ctx.Done()
	return nil
}

// WaitSynced returns once the running source holds the whole cluster in
// the registry (every informer listed, every object handled), true; or
// false when ctx ends first. What decides from the registry (address
// assignment, L2 owners) waits for it: a service handled before an older
// one that asks the same address, or before the pools, would otherwise
// be given what is not its.
func (s *Source) WaitSynced(ctx context.Context) bool {
	s.syncedMu.Lock()
	listed := s.listed
	s.syncedMu.Unlock()
	select {
	case <-listed:
		return true
	case <-ctx.Done():
		return false
	}
}

// upsert writes one object into the registry, or removes it when it no
// longer concerns the proxies (a service turned headless, say).
func (s *Source) upsert(obj any) {
	var err error
	switch o := obj.(type) {
	case *corev1.Service:
		if m := service(o, s.cfg.Classes); m != nil {
			m.NamespaceLabels = s.namespaceLabels(o.Namespace)
			err = put(s.reg.Services, m)
		} else {
			err = s.delete(s.reg.Services, o.Namespace+"/"+o.Name)
		}
	case *corev1.Namespace:
		s.namespaceChanged(o.Name)
	case *discoveryv1.EndpointSlice:
		if m := endpointSlice(o); m != nil {
			err = put(s.reg.EndpointSlices, m)
		} else {
			err = s.delete(s.reg.EndpointSlices, o.Namespace+"/"+o.Name)
		}
	case *corev1.Node:
		err = put(s.reg.Nodes, node(o))
	case *networkingv1.ServiceCIDR:
		if m := serviceCIDR(o); m != nil {
			err = put(s.reg.ServiceCIDRs, m)
		} else {
			err = s.delete(s.reg.ServiceCIDRs, o.Name)
		}
	}
	if err != nil {
		s.log.Warn("kubernetes object not mirrored", "object", fmt.Sprintf("%T", obj), "error", err)
	}
}

// namespaceLabels are the labels of namespace ns as the informer has
// them; none while it does not (namespaceChanged then puts its services
// again when it does).
func (s *Source) namespaceLabels(ns string) map[string]string {
	n, err := s.nodes.Core().V1().Namespaces().Lister().Get(ns)
	if err != nil {
		return nil
	}
	return n.Labels
}

// namespaceChanged puts again the services of namespace ns whose
// namespace labels differ from its labels now, so that a relabelled
// namespace's services are allocated from the pools that select them.
func (s *Source) namespaceChanged(ns string) {
	now := s.namespaceLabels(ns)
	objs, err := s.factory.Core().V1().Services().Informer().GetIndexer().ByIndex(cache.NamespaceIndex, ns)
	if err != nil {
		s.log.Warn("services of a relabelled namespace not found", "namespace", ns, "error", err)
		return
	}
	for _, o := range objs {
		svc := o.(*corev1.Service)
		if held, err := s.reg.Services.Get(ns + "/" + svc.Name); err == nil && maps.Equal(held.NamespaceLabels, now) {
			continue
		}
		s.upsert(svc)
	}
}

func (s *Source) remove(obj any) {
	if d, ok := obj.(cache.DeletedFinalStateUnknown); ok {
		obj = d.Obj
	}
	var err error
	switch o := obj.(type) {
	case *corev1.Service:
		err = s.delete(s.reg.Services, o.Namespace+"/"+o.Name)
	case *discoveryv1.EndpointSlice:
		err = s.delete(s.reg.EndpointSlices, o.Namespace+"/"+o.Name)
	case *corev1.Node:
		err = s.delete(s.reg.Nodes, o.Name)
	case *networkingv1.ServiceCIDR:
		err = s.delete(s.reg.ServiceCIDRs, o.Name)
	}
	if err != nil {
		s.log.Warn("kubernetes deletion not mirrored", "error", err)
	}
}

// check tells whether put would take obj, and writes nothing, for the
// admission webhook: a write that would take another object's place (a
// pool over another's addresses, made in the same second with an earlier
// name, or an older pool changed to reach a younger one's) is refused
// too, so that what the cluster holds stays in place. The source itself
// still takes such a pool when the cluster has it (see crds.upsert).
func check[T model.Object](c *registry.Collection[T], obj T) error {
	_, err := c.Get(obj.GetMeta().Key())
	switch {
	case errors.Is(err, registry.ErrNotFound):
		_, err = c.CheckCreate(obj)
	case err == nil:
		_, err = c.CheckUpdate(obj)
	}
	if gone := c.Displaces(obj); err == nil && len(gone) > 0 {
		err = fmt.Errorf("it overlaps pool %s, which the server holds: %w", gone[0], registry.ErrInUse)
	}
	return err
}

// put creates or replaces a resource the kubernetes source owns; one
// another source owns is left alone (and reported).
func put[T model.Object](c *registry.Collection[T], obj T) error {
	key := obj.GetMeta().Key()
	old, err := c.Get(key)
	switch {
	case errors.Is(err, registry.ErrNotFound):
		_, err = c.Create(obj)
		return err
	case err != nil:
		return err
	case old.GetMeta().Source != model.SourceKubernetes:
		return fmt.Errorf("%s is owned by the %s source: %w", key, old.GetMeta().Source, registry.ErrInUse)
	}
	_, err = c.Update(obj)
	return err
}

// refuseDisplaced records why the registry no longer holds the cluster's
// pools that a pool just taken displaced (the older of two overlapping
// pools is held, see registry.CompareAge), for their Accepted condition:
// the registry refuses each, naming the pool that holds its addresses. A
// pool the informer has not delivered yet, which the registry would take,
// is left to its own event.
func (c *crds) refuseDisplaced() {
	for _, p := range c.src.CustomPools() {
		held, err := c.src.reg.Pools.Get(p.Name)
		if (err == nil && held.Source == model.SourceKubernetes) || c.Refused(v1alpha1.AddressPools.Resource, p.Name) != nil {
			continue
		}
		m, err := PoolFromCRD(p)
		if err == nil {
			_, err = c.src.reg.Pools.CheckCreate(m)
			err = specField(err)
		}
		if key := v1alpha1.AddressPools.Resource + "/" + p.Name; err != nil && c.setRefused(key, err) {
			c.src.log.Warn("custom resource not taken", "resource", key, "error", err)
		}
	}
}

// delete removes a resource the kubernetes source owns.
func (s *Source) delete(c interface {
	Delete(string, uint64, string) (uint64, error)
}, key string) error {
	_, err := c.Delete(key, 0, model.SourceKubernetes)
	if errors.Is(err, registry.ErrNotFound) {
		return nil
	}
	return err
}

// removeGone deletes the registry's kubernetes-owned resources that the
// informers do not have: they went while the server was not watching.
func (s *Source) removeGone() {
	present := map[string]bool{}
	for _, o := range s.factory.Core().V1().Services().Informer().GetStore().List() {
		svc := o.(*corev1.Service)
		present["svc/"+svc.Namespace+"/"+svc.Name] = true
	}
	for _, o := range s.factory.Discovery().V1().EndpointSlices().Informer().GetStore().List() {
		sl := o.(*discoveryv1.EndpointSlice)
		present["eps/"+sl.Namespace+"/"+sl.Name] = true
	}
	for _, o := range s.nodes.Core().V1().Nodes().Informer().GetStore().List() {
		present["node/"+o.(*corev1.Node).Name] = true
	}
	if s.serviceCIDRs {
		for _, o := range s.nodes.Networking().V1().ServiceCIDRs().Informer().GetStore().List() {
			present["servicecidr/"+o.(*networkingv1.ServiceCIDR).Name] = true
		}
	}
	if s.crds != nil {
		s.crds.present(present)
		s.crds.removeGone(present)
	}
	svcs, _ := s.reg.Services.List("", nil)
	for _, m := range svcs {
		if m.Source == model.SourceKubernetes && !present["svc/"+m.Key()] {
			s.delete(s.reg.Services, m.Key())
		}
	}
	eps, _ := s.reg.EndpointSlices.List("", nil)
	for _, m := range eps {
		if m.Source == model.SourceKubernetes && !present["eps/"+m.Key()] {
			s.delete(s.reg.EndpointSlices, m.Key())
		}
	}
	nodes, _ := s.reg.Nodes.List("", nil)
	for _, m := range nodes {
		if m.Source == model.SourceKubernetes && !present["node/"+m.Key()] {
			s.delete(s.reg.Nodes, m.Key())
		}
	}
	cidrs, _ := s.reg.ServiceCIDRs.List("", nil)
	for _, m := range cidrs {
		if m.Source == model.SourceKubernetes && !present["servicecidr/"+m.Key()] {
			s.delete(s.reg.ServiceCIDRs, m.Key())
		}
	}
}

package kubernetes

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"net/netip"
	"slices"
	"strings"
	"unicode/utf8"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	apimeta "k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	clientset "k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/tools/events"
	"k8s.io/client-go/util/retry"

	"github.com/weirlb/weir/server/model"
)

// What Weir tells a Service's users: Events (kubectl describe), named as
// MetalLB names them where it has a name, and conditions in the
// Service's status.conditions, kept current.
const (
	// EventIPAllocated: addresses were assigned (Normal).
	EventIPAllocated = "IPAllocated"
	// EventAllocationFailed: no address could be assigned; the note
	// gives the reason (Warning).
	EventAllocationFailed = "AllocationFailed"
	// EventAnnounced: which nodes receive the service's addresses, and
	// how (BGP, L2), whenever that changes (Normal).
	EventAnnounced = "Announced"
	// EventNotAnnounced: no node receives an address, with every node's
	// reason (Warning).
	EventNotAnnounced = "NotAnnounced"
	// EventConflict: the nodes leave part of the Service out, because
	// another Service holds it or the server's rules refuse it (Warning).
	EventConflict = "Conflict"

	// ConditionAddressAssigned is True when Weir assigned the service its
	// addresses; False with ipam's reason (PoolExhausted, AddressTaken,
	// NotInAnyPool, NoPool) when it could not.
	ConditionAddressAssigned = "weir.dev/AddressAssigned"
	// ConditionAnnounced is True when every address has a node that
	// receives its traffic; False (NotAnnounced) when one has none.
	ConditionAnnounced = "weir.dev/Announced"
)

// weirConditions are the condition types Weir writes on a Service.
var weirConditions = []string{ConditionAddressAssigned, ConditionAnnounced}

// ReportingController names Weir in the Events it records.
const ReportingController = "weir.dev/weir-server"

// NewRecorder records Events through the cluster's events.k8s.io API
// until ctx ends.
func NewRecorder(ctx context.Context, client clientset.Interface) (events.EventRecorder, error) {
	b := events.NewBroadcaster(&events.EventSinkImpl{Interface: client.EventsV1()})
	if err := b.StartRecordingToSinkWithContext(ctx); err != nil {
		return nil, err
	}
	context.AfterFunc(ctx, b.Shutdown)
	return b.NewRecorder(scheme.Scheme, ReportingController), nil
}

// StatusWriter writes the addresses Weir assigned to a Kubernetes service
// back into its status.loadBalancer.ingress, with the AddressAssigned
// condition; the informer then brings them into the registry. With
// Events, it also records what changed on the service.
type StatusWriter struct {
	Client clientset.Interface
	Events events.EventRecorder // nil: none
	Log    *slog.Logger
}

// WriteStatus sets the service's ingress addresses and its
// AddressAssigned condition (reason "" is assigned).
func (w StatusWriter) WriteStatus(ctx context.Context, svc *model.Service, ips []netip.Addr, reason, message string) error {
	if reason != "" {
		w.Log.Warn("no load-balancer address for a Kubernetes service", "service", svc.Key(), "reason", reason, "message", message)
	}
	// The Announced condition is patched in beside: a write that crossed
	// it is done again on the new version, not lost.
	var before, after []string
	var updated *corev1.Service
	err := retryOnConflict(func() error {
		var err error
		before, after, updated, err = w.writeStatus(ctx, svc, ips, reason, message)
		return err
	})
	if err != nil || w.Events == nil {
		return err
	}
	switch {
	case reason != "":
		w.Events.Eventf(updated, nil, corev1.EventTypeWarning, EventAllocationFailed, "Allocate", "%s", note(reason+": "+message))
	case len(ips) > 0 && !slices.Equal(before, after):
		w.Events.Eventf(updated, nil, corev1.EventTypeNormal, EventIPAllocated, "Allocate", "Assigned IP %s", strings.Join(after, ", "))
	}
	return nil
}

// retryOnConflict runs fn again while it fails with a conflict, as
// client-go's retry.RetryOnConflict does, and returns what its last try
// returned. RetryOnConflict alone returns nil for a try that failed
// because the context ended (it takes that error for its own wait being
// interrupted): a leader stopping mid-write would take the write as done.
func retryOnConflict(fn func() error) error {
	var last error
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		last = fn()
		return last
	})
	if err == nil {
		err = last
	}
	return err
}

// writeStatus is one try of WriteStatus: the ingress addresses before
// and after, and the service written.
func (w StatusWriter) writeStatus(ctx context.Context, svc *model.Service, ips []netip.Addr, reason, message string) (before, after []string, _ *corev1.Service, _ error) {
	cur, err := w.Client.CoreV1().Services(svc.Namespace).Get(ctx, svc.Name, metav1.GetOptions{})
	if err != nil {
		return nil, nil, nil, err
	}
	for _, ing := range cur.Status.LoadBalancer.Ingress {
		before = append(before, ing.IP)
	}
	var ingress []corev1.LoadBalancerIngress
	for _, ip := range ips {
		ingress = append(ingress, corev1.LoadBalancerIngress{IP: ip.String()})
		after = append(after, ip.String())
	}
	cur.Status.LoadBalancer.Ingress = ingress
	cond := metav1.Condition{Type: ConditionAddressAssigned, Status: metav1.ConditionTrue, Reason: "Assigned",
		Message: "assigned " + strings.Join(after, ", "), ObservedGeneration: cur.Generation}
	if reason != "" {
		cond.Status, cond.Reason, cond.Message = metav1.ConditionFalse, reason, message
	} else if len(ips) == 0 {
		cond.Status, cond.Reason, cond.Message = metav1.ConditionFalse, "Released", "no address assigned"
	}
	apimeta.SetStatusCondition(&cur.Status.Conditions, cond)
	updated, err := w.Client.CoreV1().Services(svc.Namespace).UpdateStatus(ctx, cur, metav1.UpdateOptions{})
	return before, after, updated, err
}

// Announcement is what a service's addresses get from the nodes: Lines
// says it (one per address: which nodes receive it, and how), and
// Missing is set when some address has no node, with every node's reason
// in Lines.
type Announcement struct {
	Lines   []string
	Missing bool
}

// WriteAnnounced records a change of the service's announcement: the
// Announced condition, patched in (no conflict with the address writes),
// and an Event.
func (w StatusWriter) WriteAnnounced(ctx context.Context, svc *model.Service, a Announcement) error {
	cond := metav1.Condition{Type: ConditionAnnounced, Status: metav1.ConditionTrue, Reason: "Announced",
		Message: strings.Join(a.Lines, "; "), LastTransitionTime: metav1.Now()}
	if a.Missing {
		cond.Status, cond.Reason = metav1.ConditionFalse, "NotAnnounced"
	}
	if len(cond.Message) > 32768 { // the API's limit for a condition's message
		cond.Message = cond.Message[:32000] + "…"
	}
	cur, err := w.Client.CoreV1().Services(svc.Namespace).Get(ctx, svc.Name, metav1.GetOptions{})
	if err != nil {
		return err
	}
	if old := apimeta.FindStatusCondition(cur.Status.Conditions, ConditionAnnounced); old != nil && old.Status == cond.Status {
		if old.Message == cond.Message {
			return nil // said already (by this replica, or one that led before)
		}
		cond.LastTransitionTime = old.LastTransitionTime
	}
	cond.ObservedGeneration = cur.Generation
	// A strategic merge patch of one condition: status.conditions is a
	// map keyed by type, so the address writes' condition stays.
	patch, err := json.Marshal(map[string]any{
		"metadata": map[string]any{"uid": cur.UID}, // fails rather than patch a new service of the same name
		"status":   map[string]any{"conditions": []metav1.Condition{cond}},
	})
	if err != nil {
		return err
	}
	updated, err := w.Client.CoreV1().Services(svc.Namespace).Patch(ctx, svc.Name, types.StrategicMergePatchType, patch, metav1.PatchOptions{}, "status")
	if err != nil {
		return fmt.Errorf("patching the %s condition: %w", ConditionAnnounced, err)
	}
	if w.Events != nil {
		if a.Missing {
			w.Events.Eventf(updated, nil, corev1.EventTypeWarning, EventNotAnnounced, "Announce", "%s", note(cond.Message))
		} else {
			w.Events.Eventf(updated, nil, corev1.EventTypeNormal, EventAnnounced, "Announce", "%s", note(cond.Message))
		}
	}
	return nil
}

// ClearConditions removes Weir's conditions from a service that is no
// longer Weir's (another controller's, or no longer a LoadBalancer), so
// that its status says nothing of Weir.
func (w StatusWriter) ClearConditions(ctx context.Context, svc *model.Service) error {
	cur, err := w.Client.CoreV1().Services(svc.Namespace).Get(ctx, svc.Name, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return nil
	}
	if err != nil {
		return err
	}
	// Said already, or Weir's again since the registry saw it.
	if !hasWeirCondition(cur.Status.Conditions) || cur.Spec.Type == corev1.ServiceTypeLoadBalancer && !svc.OtherController {
		return nil
	}
	var del []map[string]string
	for _, t := range weirConditions {
		del = append(del, map[string]string{"type": t, "$patch": "delete"})
	}
	patch, err := json.Marshal(map[string]any{
		"metadata": map[string]any{"uid": cur.UID}, // fails rather than patch a new service of the same name
		"status":   map[string]any{"conditions": del},
	})
	if err != nil {
		return err
	}
	if _, err := w.Client.CoreV1().Services(svc.Namespace).Patch(ctx, svc.Name, types.StrategicMergePatchType, patch, metav1.PatchOptions{}, "status"); err != nil && !apierrors.IsNotFound(err) {
		return fmt.Errorf("removing Weir's conditions: %w", err)
	}
	return nil
}

// note cuts s to what an Event's note may hold (1 kB), at a rune.
func note(s string) string {
	const max = 1024 - len("…")
	if len(s) <= 1024 {
		return s
	}
	cut := max
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	return s[:cut] + "…"
}

// WriteConflict records what of the service the nodes leave out, and why
// (an Event; the service's status in Weir's API lists them too).
func (w StatusWriter) WriteConflict(ctx context.Context, svc *model.Service, message string) error {
	if w.Events == nil {
		return nil
	}
	cur, err := w.Client.CoreV1().Services(svc.Namespace).Get(ctx, svc.Name, metav1.GetOptions{})
	if err != nil {
		return err
	}
	w.Events.Eventf(cur, nil, corev1.EventTypeWarning, EventConflict, "Program", "%s", note("not programmed: "+message))
	return nil
}

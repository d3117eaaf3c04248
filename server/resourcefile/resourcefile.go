// Package resourcefile keeps the registry's address pools and BGP peers
// equal to a YAML file (lbctl's format: AddressPool and BgpPeer documents),
// such as a mounted Kubernetes ConfigMap. The resources it writes belong to
// the "file" source: the API may read them but not change them, and they
// go when they leave the file.
package resourcefile

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"sigs.k8s.io/yaml"

	"github.com/weirlb/weir/internal/yamldocs"
	weirv1 "github.com/weirlb/weir/proto/weir/v1"
	"github.com/weirlb/weir/server/model"
	"github.com/weirlb/weir/server/registry"
	"github.com/weirlb/weir/server/resourcewire"
)

// Resources is what a file declares.
type Resources struct {
	Pools []*model.AddressPool
	Peers []*model.BGPPeer
}

// Parse reads and validates a file's content; any bad document fails it
// whole, naming the document and the field.
func Parse(path string, data []byte) (*Resources, error) {
	out := &Resources{}
	for i, doc := range yamldocs.Split(string(data)) {
		if strings.TrimSpace(doc) == "" {
			continue
		}
		if err := out.add(doc); err != nil {
			return nil, fmt.Errorf("%s: document %d: %w", path, i+1, err)
		}
	}
	return out, nil
}

func (r *Resources) add(doc string) error {
	// Strict: a key said twice is a mistake (which one was meant?), not
	// the last one winning.
	j, err := yaml.YAMLToJSONStrict([]byte(doc))
	if err != nil {
		return err
	}
	var fields map[string]json.RawMessage
	if err := json.Unmarshal(j, &fields); err != nil {
		return err
	}
	var kind string
	json.Unmarshal(fields["kind"], &kind)
	delete(fields, "kind")
	body, _ := json.Marshal(fields)
	switch kind {
	case "AddressPool":
		m, err := decode(body, &weirv1.AddressPool{}, resourcewire.PoolFromProto)
		r.Pools = append(r.Pools, m)
		return err
	case "BgpPeer":
		m, err := decode(body, &weirv1.BgpPeer{}, resourcewire.BGPPeerFromProto)
		r.Peers = append(r.Peers, m)
		return err
	}
	return fmt.Errorf("kind %q: the resources file holds AddressPool and BgpPeer documents", kind)
}

// decode reads one document's body into msg, then the model, and
// validates it as the API would.
func decode[P proto.Message, T interface{ Validate() error }](body []byte, msg P, from func(P) (T, error)) (T, error) {
	var zero T
	if err := protojson.Unmarshal(body, msg); err != nil {
		return zero, err
	}
	m, err := from(msg)
	if err != nil {
		return zero, err
	}
	return m, m.Validate()
}

// Apply makes the registry's file-owned pools and peers those of r, as
// one write: creates, updates what changed and deletes what left the file.
// A refusal of any of them (a pool overlapping one of the API's, a name
// another source owns) changes nothing at all: the content applied before
// stays whole.
func Apply(reg *registry.Registry, r *Resources) error {
	_, err := reg.Declare(model.SourceFile, r.Pools, r.Peers)
	var be *registry.BatchError
	switch {
	case !errors.As(err, &be):
		return err
	case be.Index < len(r.Pools):
		return fmt.Errorf("AddressPool %s: %w", r.Pools[be.Index].Name, err)
	default:
		return fmt.Errorf("BgpPeer %s: %w", r.Peers[be.Index-len(r.Pools)].Name, err)
	}
}

// Watcher keeps the registry equal to a resources file.
type Watcher struct {
	Registry *registry.Registry
	Path     string
	// Period is how often the file is checked for changes.
	Period time.Duration
	// Settle is how long new content must stay the same before it is
	// applied: an editor or a shell redirection truncates the file and
	// writes it again, and a read in between sees a short or empty file.
	Settle time.Duration
	// AllowRemovingAll lets a file that holds no pool, or that removes
	// every pool with addresses in use, be applied. Without it such a file
	// is refused: it would withdraw every load-balancer address at once,
	// which is far more often a half-written or emptied file than intent.
	AllowRemovingAll bool
	// Rejected counts files refused, by reason ("invalid", "empty",
	// "removes-all-pools", "not-applied"); nil counts nothing.
	Rejected *prometheus.CounterVec
	Log      *slog.Logger
}

// NewRejectedMetric is the counter Watcher.Rejected expects, registered
// with reg when it is not nil.
func NewRejectedMetric(reg prometheus.Registerer) *prometheus.CounterVec {
	c := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "weir_resources_file_rejected_total",
		Help: "Contents of the resources file that were refused, by reason; the last good content stays applied.",
	}, []string{"reason"})
	for _, reason := range []string{"invalid", "empty", "removes-all-pools", "not-applied"} {
		c.WithLabelValues(reason) // at 0 from the start, for rate() and alerts
	}
	if reg != nil {
		reg.MustRegister(c)
	}
	return c
}

// ErrRemovesAllPools refuses a file that would withdraw every address in
// use.
var ErrRemovesAllPools = errors.New("the file removes every address pool that has addresses in use; " +
	"if that is meant, start the server with --resources-file-allow-removing-all")

// ErrEmpty refuses a file with no documents while the file's pools or
// peers are in the registry.
var ErrEmpty = errors.New("the file holds no pool and no peer, which would remove every one it declared before; " +
	"if that is meant, start the server with --resources-file-allow-removing-all")

// Watch applies the file now and again whenever its content changes (a
// ConfigMap's update reaches its mounted file within a minute), checking
// every Period. Content is applied only once it has stayed the same for
// Settle, parses, validates and passes the removal guard; otherwise the
// last good content stays, the error is logged and counted, and the same
// content is not retried until it changes.
func (w *Watcher) Watch(ctx context.Context) {
	var last []byte // the content last acted on, applied or refused
	for {
		data, err := w.stableRead(ctx)
		switch {
		case ctx.Err() != nil:
			return
		case err != nil:
			w.Log.Error("resources file unreadable", "path", w.Path, "error", err)
		case last != nil && bytes.Equal(data, last):
		default:
			if reason, err := w.apply(data); err != nil {
				w.Log.Error("resources file refused; the last good content stays", "path", w.Path, "reason", reason, "error", err)
				if w.Rejected != nil {
					w.Rejected.WithLabelValues(reason).Inc()
				}
			} else {
				w.Log.Info("resources file applied", "path", w.Path)
			}
			last = data
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(w.Period):
		}
	}
}

// stableRead reads the file until two reads Settle apart agree.
func (w *Watcher) stableRead(ctx context.Context) ([]byte, error) {
	data, err := os.ReadFile(w.Path)
	for err == nil {
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(w.Settle):
		}
		var again []byte
		if again, err = os.ReadFile(w.Path); err == nil && bytes.Equal(again, data) {
			return data, nil
		}
		data = again
	}
	return nil, err
}

func (w *Watcher) apply(data []byte) (reason string, err error) {
	r, err := Parse(w.Path, data)
	if err != nil {
		return "invalid", err
	}
	if !w.AllowRemovingAll {
		if len(r.Pools) == 0 && len(r.Peers) == 0 && holdsFileObjects(w.Registry) {
			return "empty", ErrEmpty
		}
		if removesAllPoolsInUse(w.Registry, r) {
			return "removes-all-pools", ErrRemovesAllPools
		}
	}
	if err := Apply(w.Registry, r); err != nil {
		return "not-applied", err
	}
	return "", nil
}

// removesAllPoolsInUse reports whether the file-owned pools that hold an
// address some service uses are all missing from r. A file that removes
// some of them is an operator's choice; one that removes every one of them
// is what an emptied or truncated file looks like.
func removesAllPoolsInUse(reg *registry.Registry, r *Resources) bool {
	pools, _ := reg.Pools.List("", nil)
	services, _ := reg.Services.List("", nil)
	kept := map[string]bool{}
	for _, p := range r.Pools {
		kept[p.Key()] = true
	}
	inUse := 0
	for _, p := range pools {
		if p.Source != model.SourceFile || !poolInUse(p, services) {
			continue
		}
		if kept[p.Key()] {
			return false
		}
		inUse++
	}
	return inUse > 0
}

func holdsFileObjects(reg *registry.Registry) bool {
	pools, _ := reg.Pools.List("", nil)
	peers, _ := reg.Peers.List("", nil)
	for _, p := range pools {
		if p.Source == model.SourceFile {
			return true
		}
	}
	for _, p := range peers {
		if p.Source == model.SourceFile {
			return true
		}
	}
	return false
}

func poolInUse(p *model.AddressPool, services []*model.Service) bool {
	for _, s := range services {
		for _, ip := range s.LoadBalancerIPs {
			for _, rg := range p.Ranges {
				if rg.Contains(ip) {
					return true
				}
			}
		}
	}
	return false
}

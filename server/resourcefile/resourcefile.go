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
	"reflect"
	"strings"
	"time"

	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"sigs.k8s.io/yaml"

	"github.com/weirlb/weir/internal/yamldocs"
	weirv1 "github.com/weirlb/weir/proto/weir/v1"
	"github.com/weirlb/weir/server/api"
	"github.com/weirlb/weir/server/model"
	"github.com/weirlb/weir/server/registry"
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
	j, err := yaml.YAMLToJSON([]byte(doc))
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
		m, err := decode(body, &weirv1.AddressPool{}, api.PoolFromProto)
		r.Pools = append(r.Pools, m)
		return err
	case "BgpPeer":
		m, err := decode(body, &weirv1.BgpPeer{}, api.BGPPeerFromProto)
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

// Apply makes the registry's file-owned pools and peers those of r:
// creates, updates what changed and deletes what left the file. It goes on
// past a refused write (a pool overlapping one of the API's, say) and
// returns every error.
func Apply(reg *registry.Registry, r *Resources) error {
	return errors.Join(sync(reg.Pools, r.Pools), sync(reg.Peers, r.Peers))
}

func sync[T model.Object](c *registry.Collection[T], want []T) error {
	var errs []error
	keep := map[string]bool{}
	for _, obj := range want {
		obj.GetMeta().Source = model.SourceFile
		key := obj.GetMeta().Key()
		keep[key] = true
		old, err := c.Get(key)
		switch {
		case errors.Is(err, registry.ErrNotFound):
			_, err = c.Create(obj)
		case err != nil:
		case old.GetMeta().Source != model.SourceFile:
			err = fmt.Errorf("%s is owned by the %s source: %w", key, old.GetMeta().Source, registry.ErrInUse)
		case sameSpec(old, obj):
			continue
		default:
			_, err = c.Update(obj)
		}
		if err != nil {
			errs = append(errs, err)
		}
	}
	all, _ := c.List("", nil)
	for _, old := range all {
		if key := old.GetMeta().Key(); old.GetMeta().Source == model.SourceFile && !keep[key] {
			if err := c.Delete(key, 0, model.SourceFile); err != nil && !errors.Is(err, registry.ErrNotFound) {
				errs = append(errs, err)
			}
		}
	}
	return errors.Join(errs...)
}

// sameSpec compares two objects without their bookkeeping (version,
// creation time), so that an unchanged file writes nothing. Stored objects
// are shared: it compares their JSON and changes neither.
func sameSpec[T model.Object](a, b T) bool {
	strip := func(o T) map[string]any {
		var m map[string]any
		j, _ := json.Marshal(o)
		json.Unmarshal(j, &m)
		delete(m, "resourceVersion")
		delete(m, "createTime")
		return m
	}
	return reflect.DeepEqual(strip(a), strip(b))
}

// Watch applies the file now and again whenever its content changes (a
// ConfigMap's update reaches its mounted file within a minute), checking
// every period. A file that does not read or validate changes nothing:
// the last good content stays, and the error is logged.
func Watch(ctx context.Context, reg *registry.Registry, path string, period time.Duration, log *slog.Logger) {
	var last []byte
	for {
		data, err := os.ReadFile(path)
		switch {
		case err != nil:
			log.Error("resources file unreadable", "path", path, "error", err)
		case bytes.Equal(data, last):
		default:
			r, err := Parse(path, data)
			if err == nil {
				err = Apply(reg, r)
			}
			if err != nil {
				log.Error("resources file not applied", "path", path, "error", err)
			} else {
				log.Info("resources file applied", "path", path)
			}
			last = data
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(period):
		}
	}
}

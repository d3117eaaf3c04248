package registry_test

import (
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/weirlb/weir/server/model"
	"github.com/weirlb/weir/server/registry"
	"github.com/weirlb/weir/server/registry/registrytest"
)

// Of two overlapping pools from Kubernetes, the registry holds the one
// with the older creation time (the name breaks a tie), whichever came
// first: the same answer on every replica and after every restart, empty
// store or not. Pools of Weir's own API keep the first one taken, as that
// order is the store's and lasts.
func TestOverlappingPoolsTheOlderWins(t *testing.T) {
	t0 := time.Date(2026, 11, 1, 10, 0, 0, 0, time.UTC)
	pool := func(name, source string, created time.Time, addrs string) *model.AddressPool {
		rg, err := model.ParseAddressRange(addrs)
		if err != nil {
			t.Fatal(err)
		}
		return &model.AddressPool{Meta: model.Meta{Name: name, Source: source, CreateTime: created}, Ranges: []model.AddressRange{rg}}
	}
	k8s, native := model.SourceKubernetes, model.SourceNative
	for _, tc := range []struct {
		name  string
		first *model.AddressPool
		then  *model.AddressPool
		held  string // the pool of the two the registry holds
	}{
		{"kubernetes, the older first", pool("zz-old", k8s, t0, "203.0.113.0/28"), pool("aa-new", k8s, t0.Add(time.Second), "203.0.113.8/29"), "zz-old"},
		{"kubernetes, the older second", pool("aa-new", k8s, t0.Add(time.Second), "203.0.113.8/29"), pool("zz-old", k8s, t0, "203.0.113.0/28"), "zz-old"},
		{"kubernetes, a tie, the first name first", pool("a", k8s, t0, "203.0.113.0/28"), pool("b", k8s, t0, "203.0.113.8/29"), "a"},
		{"kubernetes, a tie, the first name second", pool("b", k8s, t0, "203.0.113.8/29"), pool("a", k8s, t0, "203.0.113.0/28"), "a"},
		{"native, the first taken stays", pool("aa-new", native, t0.Add(time.Second), "203.0.113.8/29"), pool("zz-old", native, t0, "203.0.113.0/28"), "aa-new"},
		{"kubernetes beside native, the first taken stays", pool("aa-new", native, t0.Add(time.Second), "203.0.113.8/29"), pool("zz-old", k8s, t0, "203.0.113.0/28"), "aa-new"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			reg := registrytest.Open(t)
			if _, err := reg.Pools.Create(tc.first); err != nil {
				t.Fatal(err)
			}
			var changed []string
			reg.OnChange(func(ch registry.Change) { changed = append(changed, ch.Pools...) })
			_, err := reg.Pools.Create(tc.then)
			loser := tc.first.Name
			if tc.held == tc.first.Name {
				loser = tc.then.Name
				var overlap *registry.OverlapError
				if !errors.As(err, &overlap) || overlap.Pool != tc.held {
					t.Errorf("the later write of %s: %v; want an overlap with %s", tc.then.Name, err, tc.held)
				}
			} else if err != nil {
				t.Errorf("the later write of %s, which wins: %v", tc.then.Name, err)
			} else if slices.Sort(changed); !slices.Equal(changed, []string{tc.held, loser}) && !slices.Equal(changed, []string{loser, tc.held}) {
				t.Errorf("pools changed %v; want the winner taken and the loser gone in one write", changed)
			}
			pools, _ := reg.Pools.List("", nil)
			var names []string
			for _, p := range pools {
				names = append(names, p.Name)
			}
			if !slices.Equal(names, []string{tc.held}) {
				t.Errorf("the registry holds %v; want %s only (not %s)", names, tc.held, loser)
			}

			// The loser asks again (the source's retry): refused, naming the winner.
			again := *map[string]*model.AddressPool{tc.first.Name: tc.first, tc.then.Name: tc.then}[loser]
			again.ResourceVersion = 0
			if _, err := reg.Pools.Create(&again); !errors.Is(err, registry.ErrInUse) || !strings.Contains(err.Error(), "overlaps pool "+tc.held) {
				t.Errorf("%s again: %v; want an overlap with %s", loser, err, tc.held)
			}
		})
	}
}

// A Kubernetes pool updated to overlap a younger one takes its place, as
// it would have had it come with those addresses.
func TestAnOlderPoolUpdatedIntoAYoungerOneTakesItsPlace(t *testing.T) {
	t0 := time.Date(2026, 11, 1, 10, 0, 0, 0, time.UTC)
	reg := registrytest.Open(t)
	old := &model.AddressPool{Meta: model.Meta{Name: "old", Source: model.SourceKubernetes, CreateTime: t0},
		Ranges: []model.AddressRange{mustParseRange(t, "198.51.100.0/28")}}
	young := &model.AddressPool{Meta: model.Meta{Name: "young", Source: model.SourceKubernetes, CreateTime: t0.Add(time.Minute)},
		Ranges: []model.AddressRange{mustParseRange(t, "203.0.113.0/28")}}
	for _, p := range []*model.AddressPool{old, young} {
		if _, err := reg.Pools.Create(p); err != nil {
			t.Fatal(err)
		}
	}
	upd := &model.AddressPool{Meta: model.Meta{Name: "old", Source: model.SourceKubernetes, CreateTime: t0},
		Ranges: []model.AddressRange{mustParseRange(t, "198.51.100.0/28"), mustParseRange(t, "203.0.113.4/30")}}
	if _, err := reg.Pools.Update(upd); err != nil {
		t.Fatalf("the older pool's update: %v", err)
	}
	if _, err := reg.Pools.Get("young"); !errors.Is(err, registry.ErrNotFound) {
		t.Errorf("the younger pool after the older took its addresses: %v; want it gone", err)
	}
}

func mustParseRange(t *testing.T, s string) model.AddressRange {
	t.Helper()
	rg, err := model.ParseAddressRange(s)
	if err != nil {
		t.Fatal(err)
	}
	return rg
}

// A Kubernetes object's creation time is the cluster's on every write
// (one made again under its name while the server was away is younger);
// a native update keeps the stored one.
func TestTheClusterSaysWhenItsObjectWasMade(t *testing.T) {
	t0 := time.Date(2026, 11, 1, 10, 0, 0, 0, time.UTC)
	for _, source := range []string{model.SourceKubernetes, model.SourceNative} {
		reg := registrytest.Open(t)
		p := &model.AddressPool{Meta: model.Meta{Name: "p", Source: source, CreateTime: t0}, Ranges: []model.AddressRange{mustParseRange(t, "198.51.100.0/28")}}
		if _, err := reg.Pools.Create(p); err != nil {
			t.Fatal(err)
		}
		again := &model.AddressPool{Meta: model.Meta{Name: "p", Source: source, CreateTime: t0.Add(time.Hour)}, Ranges: p.Ranges}
		if _, err := reg.Pools.Update(again); err != nil {
			t.Fatal(err)
		}
		want := t0
		if source == model.SourceKubernetes {
			want = t0.Add(time.Hour)
		}
		if got, _ := reg.Pools.Get("p"); !got.CreateTime.Equal(want) {
			t.Errorf("%s pool updated: created %v; want %v", source, got.CreateTime, want)
		}
	}
}

// Displaces says, writing nothing, which pools a write would take the
// place of.
func TestDisplacesWritesNothing(t *testing.T) {
	t0 := time.Date(2026, 11, 1, 10, 0, 0, 0, time.UTC)
	reg := registrytest.Open(t)
	young := &model.AddressPool{Meta: model.Meta{Name: "young", Source: model.SourceKubernetes, CreateTime: t0.Add(time.Second)},
		Ranges: []model.AddressRange{mustParseRange(t, "203.0.113.0/28")}}
	if _, err := reg.Pools.Create(young); err != nil {
		t.Fatal(err)
	}
	old := &model.AddressPool{Meta: model.Meta{Name: "old", Source: model.SourceKubernetes, CreateTime: t0},
		Ranges: []model.AddressRange{mustParseRange(t, "203.0.113.8/29")}}
	if got := reg.Pools.Displaces(old); !slices.Equal(got, []string{"young"}) {
		t.Errorf("Displaces(old) = %v; want [young]", got)
	}
	if got := reg.Pools.Displaces(young); len(got) != 0 {
		t.Errorf("Displaces(young) = %v; want none", got)
	}
	if _, err := reg.Pools.Get("young"); err != nil {
		t.Errorf("after Displaces: %v", err)
	}
}

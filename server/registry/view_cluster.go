package registry

import "github.com/weirlb/weir/server/model"

// Nodes lists every node, by name, as stored: Aside says what sets one
// aside.
func (v View) Nodes() []*model.Node { return v.r.Nodes.list("", nil) }

// Aside is Registry.Aside within a read.
func (v View) Aside(node string) model.Aside {
	n := v.r.Nodes.items[node]
	_, drained := v.r.drained[node]
	return model.Aside{Drained: drained, Excluded: n != nil && n.Excluded()}
}

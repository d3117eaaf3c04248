package agentsync

import (
	"time"

	weirv1 "github.com/weirlb/weir/proto/weir/v1"
)

// NodeStatus is what the server knows of one node's agent.
type NodeStatus struct {
	Node           string
	Connected      bool
	SentVersion    uint64
	AppliedVersion uint64
	// Covered is the cache version up to which the node has been sent
	// every change that concerns it.
	Covered uint64
	// ProgrammingLatency is, for the last state the node applied that held
	// changes, the time from the oldest change's acceptance to the ACK.
	ProgrammingLatency time.Duration
	// LastError is the agent's last NACK, cleared by the next ACK.
	LastError        string
	LastErrorVersion uint64
	LastSeen         time.Time
	// Health is what the node last reported of its health answers.
	Health   NodeHealth
	LastSync time.Duration
	// Services is, per "namespace/name", what the node sees of a service.
	Services map[string]ServiceHealth
	// BGPSessions are the node speaker's sessions as last reported (the
	// messages are never changed once received).
	BGPSessions []*weirv1.BgpSession
	// BGPAnnouncements are what the node's speaker announces, by prefix.
	BGPAnnouncements []*weirv1.BgpAnnouncement
}

// ProgrammedVersion is the highest store revision such that everything up
// to it that concerns the node is applied in its kernel: what the agent
// acknowledged, or, once it has acknowledged everything it was sent, what
// that covered.
func (s NodeStatus) ProgrammedVersion() uint64 {
	if s.AppliedVersion >= s.SentVersion {
		return max(s.AppliedVersion, s.Covered)
	}
	return s.AppliedVersion
}

// NodeHealth is a node's own health answers (port 10256).
type NodeHealth struct {
	HealthzCode, LivezCode int
	LastUpdated            time.Time
	NodeEligible           bool
}

// ServiceHealth is one service on one node.
type ServiceHealth struct {
	LocalReady, LocalServing, LocalTerminating int
	HealthCheckNodePort                        int
	// HealthCheckCode is what the health-check port answers; 0 when it is
	// not open, and then HealthCheckError says why.
	HealthCheckCode  int
	HealthCheckError string
}

// recordReport folds an agent's report into its status. Called with h.mu held.
func recordReport(st *NodeStatus, r *weirv1.Report) {
	if nh := r.GetNodeHealth(); nh != nil {
		st.Health = NodeHealth{
			HealthzCode: int(nh.GetHealthzCode()), LivezCode: int(nh.GetLivezCode()),
			NodeEligible: nh.GetNodeEligible(),
		}
		if nh.GetLastUpdated() != nil {
			st.Health.LastUpdated = nh.GetLastUpdated().AsTime()
		}
	}
	if r.GetLastSyncDuration() != nil {
		st.LastSync = r.GetLastSyncDuration().AsDuration()
	}
	if r.GetFull() || r.GetBgp() != nil {
		st.BGPSessions = r.GetBgp().GetSessions()
		st.BGPAnnouncements = r.GetBgp().GetAnnouncements()
	}
	if r.GetFull() || st.Services == nil {
		st.Services = map[string]ServiceHealth{}
	}
	for _, s := range r.GetServices() {
		st.Services[s.GetNamespace()+"/"+s.GetName()] = ServiceHealth{
			LocalReady: int(s.GetLocalReady()), LocalServing: int(s.GetLocalServing()), LocalTerminating: int(s.GetLocalTerminating()),
			HealthCheckNodePort: int(s.GetHealthCheckNodePort()), HealthCheckCode: int(s.GetHealthCheckCode()), HealthCheckError: s.GetHealthCheckError(),
		}
	}
	for _, key := range r.GetRemovedServices() {
		delete(st.Services, key)
	}
}

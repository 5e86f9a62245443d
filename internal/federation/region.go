package federation

import (
	"fmt"
	"sort"

	"github.com/hashicorp/serf/serf"
)

// Coordinator is one coordinator as a WAN pool member shows it.
type Coordinator struct {
	Name   string // serf member name
	Status string // serf member status: alive, failed, left, leaving
	Tags   CoordinatorTags
	// Answers: the last health probe succeeded within AnswerWithin.
	Answers bool
}

// Region aggregates the coordinators of one region.
type Region struct {
	Name         string
	Jurisdiction string
	Labels       map[string]string
	Coordinators []Coordinator
	Capacity     Capacity
	Backlog      []Backlog
	UpdatedMs    int64
	// Policy is the sovereignty policy fingerprint its freshest alive
	// coordinator publishes ("" for none).
	Policy string
	Up     bool
	// DownReason says why the region is down (empty when up).
	DownReason string
}

// Addrs returns the API addresses of the coordinators that answer and whose
// etcd answers them (not etcd-unavailable), first.
func (r Region) Addrs() []string {
	var out []string
	for _, c := range r.Coordinators {
		if c.Status == "alive" && c.Answers && c.Tags.Health != HealthEtcdDown {
			out = append(out, c.Tags.APIAddr)
		}
	}
	return out
}

// BuildRegions groups a WAN pool's coordinator members (other members are
// skipped) into regions, sorted by name, and decides whether each is up.
// answers tells whether the coordinator at an API address answered its last
// health probe; it is asked only about alive members.
func BuildRegions(members []serf.Member, answers func(apiAddr string) bool) []Region {
	by := map[string]*Region{}
	for _, m := range members {
		t, ok := DecodeCoordinatorTags(m.Tags)
		if !ok {
			continue
		}
		reg := by[t.Region]
		if reg == nil {
			reg = &Region{Name: t.Region}
			by[t.Region] = reg
		}
		c := Coordinator{Name: m.Name, Status: m.Status.String(), Tags: t}
		c.Answers = m.Status == serf.StatusAlive && answers(t.APIAddr)
		reg.Coordinators = append(reg.Coordinators, c)
		// The freshest alive coordinator's tags describe the region.
		if m.Status == serf.StatusAlive && t.UpdatedMs >= reg.UpdatedMs {
			reg.Jurisdiction, reg.Labels, reg.Capacity, reg.Backlog, reg.UpdatedMs, reg.Policy = t.Jurisdiction, t.Labels, t.Capacity, t.Backlog, t.UpdatedMs, t.Policy
		} else if reg.UpdatedMs == 0 && reg.Labels == nil {
			reg.Jurisdiction, reg.Labels, reg.Policy = t.Jurisdiction, t.Labels, t.Policy
		}
	}
	out := make([]Region, 0, len(by))
	for _, reg := range by {
		sort.Slice(reg.Coordinators, func(a, b int) bool { return reg.Coordinators[a].Tags.ID < reg.Coordinators[b].Tags.ID })
		reg.Up, reg.DownReason = false, ""
		alive, answering, etcdDown := 0, 0, 0
		for _, c := range reg.Coordinators {
			if c.Status != "alive" {
				continue
			}
			alive++
			if c.Tags.Health == HealthEtcdDown {
				etcdDown++
				continue
			}
			if c.Answers {
				answering++
			}
		}
		switch {
		case alive == 0:
			reg.DownReason = fmt.Sprintf("no coordinator alive in the WAN pool (%d known, all failed or left)", len(reg.Coordinators))
		case answering == 0 && etcdDown == alive:
			reg.DownReason = "every alive coordinator reports its etcd unavailable"
		case answering == 0:
			reg.DownReason = fmt.Sprintf("%d coordinator(s) alive in the pool but none answers its gRPC health check", alive)
		default:
			reg.Up = true
		}
		out = append(out, *reg)
	}
	sort.Slice(out, func(a, b int) bool { return out[a].Name < out[b].Name })
	return out
}

// MemberCounts counts a serf pool's members by state (alive, leaving, left,
// failed), for the apiary_serf_members gauge.
func MemberCounts(s *serf.Serf) map[string]int {
	out := map[string]int{}
	for _, m := range s.Members() {
		out[m.Status.String()]++
	}
	return out
}

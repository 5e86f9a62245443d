package federation

import apiaryv1 "apiary.dev/apiary/api/apiary/v1"

// Summary renders a region as the API's RegionSummary (AdminService.ListRegions);
// each coordinator's shards_owned is its WAN tag's (-1 when it has none).
func (reg Region) Summary() *apiaryv1.RegionSummary {
	rs := &apiaryv1.RegionSummary{Name: reg.Name, Jurisdiction: reg.Jurisdiction, Labels: reg.Labels, Up: reg.Up,
		DownReason: reg.DownReason, NodesReady: int32(reg.Capacity.NodesReady), UpdatedTimeMs: reg.UpdatedMs,
		Free:        &apiaryv1.Resources{CpuMillis: reg.Capacity.Free.CPUMillis, MemoryMb: reg.Capacity.Free.MemoryMiB, Gpus: int32(reg.Capacity.Free.GPUs)},
		LargestNode: &apiaryv1.Resources{CpuMillis: reg.Capacity.Largest.CPUMillis, MemoryMb: reg.Capacity.Largest.MemoryMiB, Gpus: int32(reg.Capacity.Largest.GPUs)}}
	for _, c := range reg.Coordinators {
		rs.Coordinators = append(rs.Coordinators, &apiaryv1.RegionCoordinator{Id: c.Tags.ID, ApiAddr: c.Tags.APIAddr,
			MemberStatus: c.Status, Health: c.Tags.Health, Answers: c.Answers, ShardsOwned: int32(c.Tags.ShardsOwned)})
	}
	for _, b := range reg.Backlog {
		rs.Backlog = append(rs.Backlog, &apiaryv1.PriorityBacklog{Class: b.Class, Pending: b.Pending, Bound: b.Bound})
	}
	return rs
}

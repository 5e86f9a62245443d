// Package jobspec owns the job file: its YAML syntax, its validation rules and
// its defaults. It turns a job file into an apiaryv1.JobSpec (Parse, ParseFile),
// checks any JobSpec, whether it came from YAML or over gRPC (Validate), fills
// the documented defaults (ApplyDefaults) and computes the payload hash that a
// region uses to deduplicate submissions (PayloadHash).
//
// It is used by the client CLI (cmd/apiary job run), which parses and validates
// before it dials, and by the regional coordinator, which validates every
// SubmitJob again before any state changes. Both must agree, so the rules live
// here and only here.
//
// Secret environment values (secretenv.go) are a task group's secret_env,
// written in a file as an env entry {value: ..., secret: true} or in a
// secret_env mapping. This package checks them like env, leaves their values
// out of PayloadHash and out of every error message, and redacts them
// (Redact); sealing them is the region's business.
//
// Field paths in errors use the YAML names (tasks[0].resources.memory_mb,
// tasks[1].spread[0].weight, tasks[0].timeout), also for specs that came over
// gRPC, so that a user sees the name they wrote in their file.
//
// Zero values in a JobSpec mean "use the default" (proto3 has no presence):
// priority 0 → 50, max_attempts 0 → 3, count 0 → 1, cpu_millis 0 → 100,
// memory_mb 0 → 64, scheduler "" → binpack. Parse therefore rejects an explicit
// 0 for those fields in a job file, so a user who writes `count: 0` is told,
// not silently given one task.
//
// Requests and limits (QoS classes, Kubernetes' Guaranteed, Burstable and
// BestEffort; internal/qos): resources.limits {cpu_millis, memory_mb} is
// the most an attempt may use (0: no limit; the agent enforces it with
// cgroup limits where it has cgroups). Each limit must be >= its request
// after the defaults, and bounded like the request (limits.cpu_millis at
// least MinCPULimitMillis). A request left unset takes its limit before
// the defaults apply (Kubernetes' rule; ApplyResourceDefaults), so limits
// alone make a task Guaranteed. resources.best_effort: true excludes
// cpu_millis, memory_mb, gpus, gpu_milli and limits, and gets no default
// requests: a BestEffort task reserves nothing (QoSClass).
//
// What it must not touch: no I/O beyond reading the one job file it is given
// (ParseFile), no network, no etcd, no placement or scheduling decisions (the
// semantics of constraints, spreads and affinities belong to placement/; this
// package only checks that they are well-formed), and no global state.
package jobspec

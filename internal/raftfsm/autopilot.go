package raftfsm

import (
	"fmt"
	"sort"
	"time"
)

// Autopilot: the membership policy of Consul's autopilot, as a pure
// function over what the leader knows of each member. Written here rather
// than with hashicorp/raft-autopilot because the leader already health-
// checks every member for the routing view (liveness.go), the library's
// stable-server promoter has no voter cap, and it brings its own stats RPC
// and goroutines; a pure plan is also testable step by step.
//
//   - A joining node enters as a non-voter. It is promoted to voter once it
//     has been healthy (caught up with the log, answering its member
//     health check) for the stabilization time, while there are fewer than
//     MaxVoters voters. Non-voters still own keys.
//   - A non-voter unreachable for DeadAfter is removed; a voter too when
//     CleanupDeadVoters is set and the voters left keep a healthy quorum.
//     The leader never removes itself.

// apMember is what the policy knows of one member.
type apMember struct {
	ID      string
	Voter   bool
	Healthy bool
	// For is how long Healthy has held (as the leader has seen it).
	For  time.Duration
	Self bool
}

// apPolicy is the autopilot configuration.
type apPolicy struct {
	MaxVoters         int
	Stabilization     time.Duration
	DeadAfter         time.Duration
	CleanupDeadVoters bool
}

// apPlan is what the leader should change now.
type apPlan struct {
	Promote []string
	Remove  []string
}

// quorum is the majority of n voters.
func quorum(n int) int { return n/2 + 1 }

// plan decides promotions and removals. Members are taken in id order so
// that the plan is deterministic.
func (p apPolicy) plan(members []apMember) apPlan {
	ms := append([]apMember(nil), members...)
	sort.Slice(ms, func(i, j int) bool { return ms[i].ID < ms[j].ID })
	voters, healthyVoters := 0, 0
	for _, m := range ms {
		if m.Voter {
			voters++
			if m.Healthy {
				healthyVoters++
			}
		}
	}
	var out apPlan
	for _, m := range ms {
		if m.Self {
			continue
		}
		dead := !m.Healthy && p.DeadAfter > 0 && m.For >= p.DeadAfter
		switch {
		case !m.Voter && dead:
			out.Remove = append(out.Remove, m.ID)
		case m.Voter && dead && p.CleanupDeadVoters && healthyVoters >= quorum(voters-1):
			out.Remove = append(out.Remove, m.ID)
			voters--
		}
	}
	for _, m := range ms {
		if !m.Voter && m.Healthy && m.For >= p.Stabilization && voters < p.MaxVoters {
			out.Promote = append(out.Promote, m.ID)
			voters++
		}
	}
	return out
}

// describe says in words where a member stands: its suffrage ("voter",
// "nonvoter" or "staging") and its stabilization state.
func (p apPolicy) describe(m apMember, voters int) (suffrage, state string) {
	switch {
	case m.Voter && m.Healthy:
		return "voter", "stable"
	case m.Voter:
		return "voter", fmt.Sprintf("unhealthy for %s", m.For.Round(time.Second))
	case !m.Healthy:
		return "nonvoter", fmt.Sprintf("unhealthy for %s", m.For.Round(time.Second))
	case voters >= p.MaxVoters:
		return "nonvoter", fmt.Sprintf("nonvoter: max voters (%d) reached", p.MaxVoters)
	case m.For < p.Stabilization:
		return "staging", fmt.Sprintf("staging: healthy %s of %s", m.For.Round(time.Second), p.Stabilization)
	}
	return "staging", "promoting"
}

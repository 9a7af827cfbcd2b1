package raftfsm

import (
	"slices"
	"testing"
	"time"
)

func TestAutopilotPlan(t *testing.T) {
	p := apPolicy{MaxVoters: 3, Stabilization: 10 * time.Second, DeadAfter: time.Hour}
	s := time.Second
	for _, tt := range []struct {
		name            string
		policy          apPolicy
		members         []apMember
		promote, remove []string
	}{
		{"a stable non-voter is promoted", p,
			[]apMember{{ID: "a", Voter: true, Healthy: true, Self: true}, {ID: "b", Healthy: true, For: 10 * s}}, []string{"b"}, nil},
		{"not before the stabilization time", p,
			[]apMember{{ID: "a", Voter: true, Healthy: true, Self: true}, {ID: "b", Healthy: true, For: 9 * s}}, nil, nil},
		{"an unhealthy non-voter is not promoted", p,
			[]apMember{{ID: "a", Voter: true, Healthy: true, Self: true}, {ID: "b", For: time.Minute}}, nil, nil},
		{"no more voters than the cap, in id order", p,
			[]apMember{{ID: "a", Voter: true, Healthy: true, Self: true}, {ID: "d", Healthy: true, For: time.Minute},
				{ID: "c", Healthy: true, For: time.Minute}, {ID: "b", Healthy: true, For: time.Minute}}, []string{"b", "c"}, nil},
		{"at the cap, nothing is promoted", p,
			[]apMember{{ID: "a", Voter: true, Healthy: true, Self: true}, {ID: "b", Voter: true, Healthy: true}, {ID: "c", Voter: true, Healthy: true},
				{ID: "d", Healthy: true, For: time.Hour}}, nil, nil},
		{"a dead non-voter is removed", p,
			[]apMember{{ID: "a", Voter: true, Healthy: true, Self: true}, {ID: "b", For: time.Hour}}, nil, []string{"b"}},
		{"a dead voter stays without the flag", p,
			[]apMember{{ID: "a", Voter: true, Healthy: true, Self: true}, {ID: "b", Voter: true, Healthy: true}, {ID: "c", Voter: true, For: 2 * time.Hour}}, nil, nil},
		{"a dead voter goes with the flag when a healthy quorum stays",
			apPolicy{MaxVoters: 5, Stabilization: 10 * s, DeadAfter: time.Hour, CleanupDeadVoters: true},
			[]apMember{{ID: "a", Voter: true, Healthy: true, Self: true}, {ID: "b", Voter: true, Healthy: true}, {ID: "c", Voter: true, For: 2 * time.Hour}}, nil, []string{"c"}},
		{"never when the voters left lack a healthy quorum",
			apPolicy{MaxVoters: 5, Stabilization: 10 * s, DeadAfter: time.Hour, CleanupDeadVoters: true},
			[]apMember{{ID: "a", Voter: true, Healthy: true, Self: true}, {ID: "b", Voter: true, For: 2 * time.Hour}, {ID: "c", Voter: true, For: 2 * time.Hour},
				{ID: "d", Voter: true, For: 2 * time.Hour}, {ID: "e", Voter: true, Healthy: true}}, nil, nil},
		{"the leader never removes itself",
			apPolicy{MaxVoters: 5, DeadAfter: time.Second, CleanupDeadVoters: true},
			[]apMember{{ID: "a", Voter: true, For: time.Hour, Self: true}, {ID: "b", Voter: true, Healthy: true}, {ID: "c", Voter: true, Healthy: true}}, nil, nil},
		{"a removal makes room for a promotion", apPolicy{MaxVoters: 3, Stabilization: 10 * s, DeadAfter: time.Hour, CleanupDeadVoters: true},
			[]apMember{{ID: "a", Voter: true, Healthy: true, Self: true}, {ID: "b", Voter: true, Healthy: true}, {ID: "c", Voter: true, For: 2 * time.Hour},
				{ID: "d", Healthy: true, For: time.Minute}}, []string{"d"}, []string{"c"}},
		{"dead-member cleanup off", apPolicy{MaxVoters: 3, Stabilization: 10 * s},
			[]apMember{{ID: "a", Voter: true, Healthy: true, Self: true}, {ID: "b", For: 1000 * time.Hour}}, nil, nil},
	} {
		t.Run(tt.name, func(t *testing.T) {
			got := tt.policy.plan(tt.members)
			if !slices.Equal(got.Promote, tt.promote) || !slices.Equal(got.Remove, tt.remove) {
				t.Fatalf("plan = promote %v remove %v, want promote %v remove %v", got.Promote, got.Remove, tt.promote, tt.remove)
			}
		})
	}
}

func TestAutopilotDescribe(t *testing.T) {
	p := apPolicy{MaxVoters: 3, Stabilization: 10 * time.Second}
	for _, tt := range []struct {
		m               apMember
		voters          int
		suffrage, state string
	}{
		{apMember{Voter: true, Healthy: true}, 3, "voter", "stable"},
		{apMember{Voter: true, For: 12 * time.Second}, 3, "voter", "unhealthy for 12s"},
		{apMember{Healthy: true, For: 4 * time.Second}, 2, "staging", "staging: healthy 4s of 10s"},
		{apMember{Healthy: true, For: time.Minute}, 3, "nonvoter", "nonvoter: max voters (3) reached"},
		{apMember{For: 3 * time.Second}, 1, "nonvoter", "unhealthy for 3s"},
	} {
		if s, st := p.describe(tt.m, tt.voters); s != tt.suffrage || st != tt.state {
			t.Errorf("describe(%+v, %d) = %q %q, want %q %q", tt.m, tt.voters, s, st, tt.suffrage, tt.state)
		}
	}
}

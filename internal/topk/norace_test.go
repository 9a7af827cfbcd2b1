//go:build !race

package topk

// raceEnabled is true when tests run under the race detector.
const raceEnabled = false

//go:build race

package topk

// raceEnabled is true when tests run under the race detector, which slows
// the million-decision accuracy run about tenfold.
const raceEnabled = true

//go:build race

package e2e

// raceEnabled: the tests run under the race detector, so the proxy is built with it too.
const raceEnabled = true

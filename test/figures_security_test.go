//go:build multiprocess && figures

package e2e

import (
	"crypto/tls"
	"testing"
	"time"

	"github.com/tokenserver/tokenserver/internal/testcluster"
)

// TestFiguresRotation: the time from rewriting a node's certificate and key
// to the first new connection that sees the new certificate, on a real
// process with the default reload interval (5 s), 6 rotations.
func TestFiguresRotation(t *testing.T) {
	pki := testcluster.NewPKI(t, "n0")
	s := startServer(t, append([]string{"--node-id", "n0", "--grpc-addr", "127.0.0.1:0", "--http-addr", "", "--raft-addr", "127.0.0.1:0",
		"--data-dir", t.TempDir()}, pki.NodeArgs("n0")...)...)
	var took []time.Duration
	for i := 0; i < 6; i++ {
		kp := pki.IssueNode(t, "n0")
		start := time.Now()
		for {
			conn, err := tls.Dial("tcp", s.grpcAddr, pki.ClientTLS())
			if err == nil {
				same := conn.ConnectionState().PeerCertificates[0].SerialNumber.Cmp(kp.Cert.SerialNumber) == 0
				conn.Close()
				if same {
					break
				}
			}
			if time.Since(start) > 20*time.Second {
				t.Fatalf("rotation %d: the new certificate is not served after 20s", i)
			}
			time.Sleep(10 * time.Millisecond)
		}
		took = append(took, time.Since(start))
		time.Sleep(time.Duration(700*(i+1)) * time.Millisecond % (5 * time.Second)) // land at different points of the poll
	}
	t.Logf("FIGURE rotated certificate served to new connections after: median %v max %v (6 rotations, default 5 s reload)", pct(took, .5), pct(took, 1))
	s.stop(t)
}

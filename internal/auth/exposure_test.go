package auth

import (
	"strings"
	"testing"
)

func TestCheckExposure(t *testing.T) {
	tests := []struct {
		name                    string
		tlsOn, authOn, insecure bool
		addrs                   []string
		wantErr                 string
	}{
		{"loopback only", false, false, false, []string{"127.0.0.1:7070", "localhost:7071", "[::1]:7072", ""}, ""},
		{"all interfaces", false, false, false, []string{"127.0.0.1:7070", "0.0.0.0:7071"}, "0.0.0.0:7071"},
		{"empty host", false, false, false, []string{":7070"}, ":7070"},
		{"a name", false, false, false, []string{"node1.example:7070"}, "--tls-cert"},
		{"TLS", true, false, false, []string{"0.0.0.0:7070"}, ""},
		{"tokens", false, true, false, []string{"0.0.0.0:7070"}, ""},
		{"insecure", false, false, true, []string{"0.0.0.0:7070"}, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := CheckExposure(tt.tlsOn, tt.authOn, tt.insecure, tt.addrs...)
			if tt.wantErr == "" {
				if err != nil {
					t.Errorf("error %v", err)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tt.wantErr) || !strings.Contains(err.Error(), "--insecure") {
				t.Errorf("error %v, want one naming %q and --insecure", err, tt.wantErr)
			}
		})
	}
}

package auth

import (
	"bufio"
	"bytes"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"fmt"
	"strings"
)

// tokenTable maps SHA-256 digests of bearer tokens to their principals.
type tokenTable map[[32]byte]*Principal

// parseTokens parses a token file: one `sha256:HEX PRINCIPAL ROLE[,ROLE...]`
// per line; blank lines and lines starting with # are skipped.
func parseTokens(data []byte, name string) (tokenTable, error) {
	t := tokenTable{}
	sc := bufio.NewScanner(bytes.NewReader(data))
	for line := 1; sc.Scan(); line++ {
		text := strings.TrimSpace(sc.Text())
		if text == "" || strings.HasPrefix(text, "#") {
			continue
		}
		f := strings.Fields(text)
		if len(f) != 3 {
			return nil, fmt.Errorf("%s:%d: want `sha256:HEX PRINCIPAL ROLE[,ROLE...]`, got %d fields", name, line, len(f))
		}
		hexDigest, ok := strings.CutPrefix(f[0], "sha256:")
		if !ok {
			return nil, fmt.Errorf("%s:%d: the token hash must start with sha256: (the file holds hashes, never tokens)", name, line)
		}
		var d [32]byte
		if n, err := hex.Decode(d[:], []byte(hexDigest)); err != nil || n != 32 || len(hexDigest) != 64 {
			return nil, fmt.Errorf("%s:%d: sha256: wants 64 hex digits", name, line)
		}
		roles, err := ParseRoles(f[2])
		if err != nil {
			return nil, fmt.Errorf("%s:%d: %w", name, line, err)
		}
		if _, dup := t[d]; dup {
			return nil, fmt.Errorf("%s:%d: the same token hash is listed twice", name, line)
		}
		t[d] = &Principal{Name: f[1], Roles: roles, Source: SourceToken, have: roles.expand()}
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("%s: %w", name, err)
	}
	return t, nil
}

// NewToken returns a random bearer token (256 bits, URL-safe base64) and
// its token-file line for principal and roles.
func NewToken(principal string, roles Role) (token, line string, err error) {
	if principal == "" || strings.ContainsAny(principal, " \t\n#") {
		return "", "", fmt.Errorf("principal %q must be non-empty without spaces or #", principal)
	}
	if roles == 0 {
		return "", "", fmt.Errorf("token for %q: no role", principal)
	}
	var b [32]byte
	if _, err := rand.Read(b[:]); err != nil {
		return "", "", fmt.Errorf("random token: %w", err)
	}
	token = base64.RawURLEncoding.EncodeToString(b[:])
	return token, TokenLine(token, principal, roles), nil
}

// TokenLine is the token-file line that admits token as principal with
// roles.
func TokenLine(token, principal string, roles Role) string {
	d := sha256.Sum256([]byte(token))
	return fmt.Sprintf("sha256:%s %s %s", hex.EncodeToString(d[:]), principal, roles)
}

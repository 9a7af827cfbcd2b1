package auth

import (
	"bufio"
	"bytes"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"fmt"
	"strings"
)

// tokenTable maps SHA-256 digests of bearer tokens to their principals.
type tokenTable map[[32]byte]*Principal

// parseTokens parses a token file strictly: the table of its good lines,
// and an error joining every bad line's (nil when none is bad).
func parseTokens(data []byte, name string) (tokenTable, error) {
	t, bad := parseTokenLines(data, name)
	return t, errors.Join(bad...)
}

// parseTokenLines parses a token file: one `sha256:HEX PRINCIPAL
// ROLE[,ROLE...]` per line; blank lines and lines starting with # are
// skipped. A bad line is left out of the table and reported, each with
// its line number, so that one typo does not keep the rest of an edit
// (removals included) from taking effect. A hash listed twice is left out
// altogether: which of its lines was meant is unknown.
func parseTokenLines(data []byte, name string) (tokenTable, []error) {
	t := tokenTable{}
	var bad []error
	dupes := map[[32]byte]bool{}
	sc := bufio.NewScanner(bytes.NewReader(data))
	sc.Buffer(make([]byte, 0, 4096), 1<<20)
	for line := 1; sc.Scan(); line++ {
		text := strings.TrimSpace(sc.Text())
		if text == "" || strings.HasPrefix(text, "#") {
			continue
		}
		d, p, err := parseTokenLine(text)
		if err == nil && (t[d] != nil || dupes[d]) {
			dupes[d] = true
			err = errors.New("the same token hash is listed twice (both lines are ignored)")
		}
		if err != nil {
			bad = append(bad, fmt.Errorf("%s:%d: %w", name, line, err))
			continue
		}
		t[d] = p
	}
	for d := range dupes {
		delete(t, d)
	}
	if err := sc.Err(); err != nil {
		bad = append(bad, fmt.Errorf("%s: %w", name, err))
	}
	return t, bad
}

// parseTokenLine parses one non-blank, non-comment line.
func parseTokenLine(text string) ([32]byte, *Principal, error) {
	var d [32]byte
	f := strings.Fields(text)
	if len(f) != 3 {
		return d, nil, fmt.Errorf("want `sha256:HEX PRINCIPAL ROLE[,ROLE...]`, got %d fields", len(f))
	}
	hexDigest, ok := strings.CutPrefix(f[0], "sha256:")
	if !ok {
		return d, nil, errors.New("the token hash must start with sha256: (the file holds hashes, never tokens)")
	}
	if n, err := hex.Decode(d[:], []byte(hexDigest)); err != nil || n != 32 || len(hexDigest) != 64 {
		return d, nil, errors.New("sha256: wants 64 hex digits")
	}
	roles, scope, err := parseScopedRoles(f[2])
	if err != nil {
		return d, nil, err
	}
	return d, &Principal{Name: f[1], Roles: roles, Source: SourceToken, Scope: scope, have: roles.expand(), digest: d}, nil
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

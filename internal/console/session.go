package console

import (
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/base64"
	"sync"
	"time"
)

// session is one signed-in browser. Its fields after creation are only
// read, except lastUsed and flash, which the store's lock guards.
type session struct {
	id   string
	csrf string
	// token is the bearer token from the login form ("" for a certificate
	// or a no-auth session).
	token string
	// certHash is the SHA-256 of the client certificate that opened a
	// certificate session; a request must present the same one.
	certHash  [32]byte
	principal Principal
	created   time.Time
	lastUsed  time.Time
	flash     string
}

// sessionStore holds sessions in memory, bounded in number and in age.
// Safe for concurrent use.
type sessionStore struct {
	now     func() time.Time
	idle    time.Duration
	maxAge  time.Duration
	maxSize int

	mu       sync.Mutex
	sessions map[string]*session
}

func newSessionStore(now func() time.Time, idle, maxAge time.Duration, maxSize int) *sessionStore {
	return &sessionStore{now: now, idle: idle, maxAge: maxAge, maxSize: maxSize, sessions: make(map[string]*session)}
}

// randomID returns 32 random bytes, base64url-encoded.
func randomID() string {
	var b [32]byte
	_, _ = rand.Read(b[:]) // crypto/rand.Read never fails (Go 1.24+).
	return base64.RawURLEncoding.EncodeToString(b[:])
}

// create stores a new session. At the bound it first drops expired
// sessions, then the least recently used one.
func (s *sessionStore) create(token string, certHash [32]byte, p Principal) *session {
	now := s.now()
	ss := &session{id: randomID(), csrf: randomID(), token: token, certHash: certHash, principal: p, created: now, lastUsed: now}
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.sessions) >= s.maxSize {
		s.sweepLocked(now)
	}
	for len(s.sessions) >= s.maxSize {
		var oldest *session
		for _, x := range s.sessions {
			if oldest == nil || x.lastUsed.Before(oldest.lastUsed) {
				oldest = x
			}
		}
		delete(s.sessions, oldest.id)
	}
	s.sessions[ss.id] = ss
	return ss
}

func (s *sessionStore) expired(ss *session, now time.Time) bool {
	return now.Sub(ss.lastUsed) > s.idle || now.Sub(ss.created) > s.maxAge
}

func (s *sessionStore) sweepLocked(now time.Time) {
	for id, ss := range s.sessions {
		if s.expired(ss, now) {
			delete(s.sessions, id)
		}
	}
}

// get returns the live session id names and marks it used, or nil.
func (s *sessionStore) get(id string) *session {
	if id == "" {
		return nil
	}
	now := s.now()
	s.mu.Lock()
	defer s.mu.Unlock()
	ss := s.sessions[id]
	if ss == nil {
		return nil
	}
	if s.expired(ss, now) {
		delete(s.sessions, id)
		return nil
	}
	ss.lastUsed = now
	return ss
}

func (s *sessionStore) delete(id string) {
	s.mu.Lock()
	delete(s.sessions, id)
	s.mu.Unlock()
}

// setFlash keeps a one-shot message for the session's next page.
func (s *sessionStore) setFlash(ss *session, msg string) {
	s.mu.Lock()
	ss.flash = msg
	s.mu.Unlock()
}

// takeFlash returns and clears the session's message.
func (s *sessionStore) takeFlash(ss *session) string {
	s.mu.Lock()
	defer s.mu.Unlock()
	m := ss.flash
	ss.flash = ""
	return m
}

// validCSRF reports whether token is the session's CSRF token.
func (ss *session) validCSRF(token string) bool {
	return token != "" && subtle.ConstantTimeCompare([]byte(token), []byte(ss.csrf)) == 1
}

func certHash(raw []byte) [32]byte { return sha256.Sum256(raw) }

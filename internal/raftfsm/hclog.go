package raftfsm

import (
	"context"
	"fmt"
	"io"
	"log"
	"log/slog"
	"strings"

	"github.com/hashicorp/go-hclog"
)

// slogLogger bridges hashicorp/raft's hclog.Logger to log/slog, so Raft's
// lines share the node's format, level and sink. hclog offers no slog
// adapter of its own; this is the whole interface.
type slogLogger struct {
	l     *slog.Logger
	name  string
	args  []any
	level hclog.Level
}

var _ hclog.Logger = (*slogLogger)(nil)

// newHCLogger returns an hclog.Logger named name writing to l.
func newHCLogger(l *slog.Logger, name string) hclog.Logger {
	s := &slogLogger{l: l, name: name, level: hclog.Trace}
	return s
}

func toSlog(level hclog.Level) slog.Level {
	switch level {
	case hclog.Trace, hclog.Debug:
		return slog.LevelDebug
	case hclog.Warn:
		return slog.LevelWarn
	case hclog.Error:
		return slog.LevelError
	}
	return slog.LevelInfo
}

func (s *slogLogger) Log(level hclog.Level, msg string, args ...any) {
	if level < s.level || level == hclog.Off {
		return
	}
	lv := toSlog(level)
	if !s.l.Enabled(context.Background(), lv) {
		return
	}
	all := make([]any, 0, len(s.args)+len(args)+2)
	all = append(all, "logger", s.name)
	all = append(all, s.args...)
	for _, a := range args {
		switch v := a.(type) {
		case hclog.Format:
			if len(v) > 0 {
				format, _ := v[0].(string)
				a = fmt.Sprintf(format, v[1:]...)
			}
		case error:
			a = v.Error()
		case fmt.Stringer:
			a = v.String()
		}
		all = append(all, a)
	}
	s.l.Log(context.Background(), lv, msg, all...)
}

func (s *slogLogger) Trace(msg string, args ...any) { s.Log(hclog.Trace, msg, args...) }
func (s *slogLogger) Debug(msg string, args ...any) { s.Log(hclog.Debug, msg, args...) }
func (s *slogLogger) Info(msg string, args ...any)  { s.Log(hclog.Info, msg, args...) }
func (s *slogLogger) Warn(msg string, args ...any)  { s.Log(hclog.Warn, msg, args...) }
func (s *slogLogger) Error(msg string, args ...any) { s.Log(hclog.Error, msg, args...) }

func (s *slogLogger) enabled(level hclog.Level) bool {
	return level >= s.level && s.l.Enabled(context.Background(), toSlog(level))
}

func (s *slogLogger) IsTrace() bool { return s.enabled(hclog.Trace) }
func (s *slogLogger) IsDebug() bool { return s.enabled(hclog.Debug) }
func (s *slogLogger) IsInfo() bool  { return s.enabled(hclog.Info) }
func (s *slogLogger) IsWarn() bool  { return s.enabled(hclog.Warn) }
func (s *slogLogger) IsError() bool { return s.enabled(hclog.Error) }

func (s *slogLogger) ImpliedArgs() []any { return s.args }

func (s *slogLogger) With(args ...any) hclog.Logger {
	c := *s
	c.args = append(append([]any(nil), s.args...), args...)
	return &c
}

func (s *slogLogger) Name() string { return s.name }

func (s *slogLogger) Named(name string) hclog.Logger {
	c := *s
	if c.name != "" {
		c.name += "." + name
	} else {
		c.name = name
	}
	return &c
}

func (s *slogLogger) ResetNamed(name string) hclog.Logger {
	c := *s
	c.name = name
	return &c
}

func (s *slogLogger) SetLevel(level hclog.Level) { s.level = level }
func (s *slogLogger) GetLevel() hclog.Level      { return s.level }

func (s *slogLogger) StandardLogger(opts *hclog.StandardLoggerOptions) *log.Logger {
	return log.New(s.StandardWriter(opts), "", 0)
}

func (s *slogLogger) StandardWriter(*hclog.StandardLoggerOptions) io.Writer {
	return writerFunc(func(p []byte) (int, error) {
		msg := strings.TrimSpace(string(p))
		level := hclog.Info
		for _, l := range []struct {
			prefix string
			level  hclog.Level
		}{{"[ERR]", hclog.Error}, {"[ERROR]", hclog.Error}, {"[WARN]", hclog.Warn}, {"[DEBUG]", hclog.Debug}, {"[TRACE]", hclog.Trace}, {"[INFO]", hclog.Info}} {
			if strings.HasPrefix(msg, l.prefix) {
				level, msg = l.level, strings.TrimSpace(strings.TrimPrefix(msg, l.prefix))
				break
			}
		}
		s.Log(level, msg)
		return len(p), nil
	})
}

type writerFunc func([]byte) (int, error)

func (f writerFunc) Write(p []byte) (int, error) { return f(p) }

package console

import (
	"bytes"
	"crypto/sha256"
	"embed"
	"encoding/hex"
	"fmt"
	"html/template"
	"io/fs"
	"net/http"
	"net/url"
	"strings"
	"time"
)

//go:embed templates/*.html
var templateFS embed.FS

//go:embed assets
var assetFS embed.FS

// pageNames are the templates/*.html files that are whole pages.
var pageNames = []string{"login", "cluster", "rules", "rule", "edit", "diff", "rollback", "overrides", "envoy", "error"}

// topTable is one table of top keys.
type topTable struct {
	Kind, Err, Window string
	Keys              []TopKey
}

// renderer holds the parsed templates and the embedded assets.
type renderer struct {
	pages    map[string]*template.Template
	assetFS  fs.FS
	assetVer map[string]string // asset path → content hash, for cache busting
}

func newRenderer() *renderer {
	sub, err := fs.Sub(assetFS, "assets")
	if err != nil {
		panic(fmt.Sprintf("console: embedded assets: %v", err))
	}
	rd := &renderer{pages: make(map[string]*template.Template), assetFS: sub, assetVer: make(map[string]string)}
	err = fs.WalkDir(sub, ".", func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		b, err := fs.ReadFile(sub, p)
		if err != nil {
			return err
		}
		sum := sha256.Sum256(b)
		rd.assetVer[p] = hex.EncodeToString(sum[:6])
		return nil
	})
	if err != nil {
		panic(fmt.Sprintf("console: hashing embedded assets: %v", err))
	}
	funcs := template.FuncMap{
		"asset":    rd.assetURL,
		"pct":      formatPct,
		"rate":     formatRate,
		"bytes":    formatBytes,
		"dur":      func(d time.Duration) string { return d.String() },
		"when":     func(t time.Time) string { return t.UTC().Format("2006-01-02 15:04:05Z") },
		"ruleURL":  ruleURL,
		"ruleAPI":  func(name string) string { return "/ui/api/rules/" + url.PathEscape(name) },
		"rulePart": func(name string) string { return "/ui/part/rules/" + url.PathEscape(name) },
		"join":     strings.Join,
		"add":      func(a, b int) int { return a + b },
		"top": func(kind string, keys []TopKey, err, window string) topTable {
			return topTable{Kind: kind, Keys: keys, Err: err, Window: window}
		},
	}
	for _, name := range pageNames {
		// Each page is its own set, so every page defines "content".
		rd.pages[name] = template.Must(template.New(name).Funcs(funcs).ParseFS(templateFS, "templates/layout.html", "templates/"+name+".html"))
	}
	return rd
}

// assetURL names an embedded asset with its content hash, so browsers
// may cache it for long.
func (rd *renderer) assetURL(p string) string {
	v, ok := rd.assetVer[p]
	if !ok {
		panic("console: no embedded asset " + p)
	}
	return "/ui/assets/" + p + "?v=" + v
}

// assets serves the embedded assets; a URL naming the current hash is
// cached for a year.
func (rd *renderer) assets() http.Handler {
	files := http.StripPrefix("/ui/assets/", http.FileServerFS(rd.assetFS))
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		p := strings.TrimPrefix(r.URL.Path, "/ui/assets/")
		if v := r.URL.Query().Get("v"); v != "" && v == rd.assetVer[p] {
			w.Header().Set("Cache-Control", "public, max-age=31536000, immutable")
		} else {
			w.Header().Set("Cache-Control", "no-cache")
		}
		files.ServeHTTP(w, r)
	})
}

// render executes template tmpl of page into w with the status code.
func (rd *renderer) render(w http.ResponseWriter, code int, page, tmpl string, data any) {
	var buf bytes.Buffer
	if err := rd.pages[page].ExecuteTemplate(&buf, tmpl, data); err != nil {
		http.Error(w, "console: rendering "+page+": "+err.Error(), http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(code)
	_, _ = w.Write(buf.Bytes())
}

func ruleURL(name string) string { return "/ui/rules/" + url.PathEscape(name) }

func formatRate(f float64) string {
	switch {
	case f >= 1e6:
		return fmt.Sprintf("%.1fM/s", f/1e6)
	case f >= 1e4:
		return fmt.Sprintf("%.1fk/s", f/1e3)
	case f >= 100 || f == 0:
		return fmt.Sprintf("%.0f/s", f)
	}
	return fmt.Sprintf("%.1f/s", f)
}

func formatPct(f float64) string { return fmt.Sprintf("%.1f%%", f*100) }

func formatBytes(n int64) string {
	const unit = 1024
	if n < unit {
		return fmt.Sprintf("%d B", n)
	}
	div, exp := int64(unit), 0
	for m := n / unit; m >= unit; m /= unit {
		div *= unit
		exp++
	}
	return fmt.Sprintf("%.1f %ciB", float64(n)/float64(div), "KMGTPE"[exp])
}

package guard

import (
	"encoding/json"
	"errors"
	"net/http"
	"strings"
)

// ReportHandler serves GET /policy/report: a text table by default (for
// curl), JSON with ?format=json or an Accept header asking for JSON; and
// DELETE /policy/report, which empties it.
func (g *Guard) ReportHandler() http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodDelete {
			g.ResetReport()
			w.Header().Set("Content-Type", "text/plain; charset=utf-8")
			w.Write([]byte("policy report emptied\n"))
			return
		}
		rep := g.Report()
		format := strings.ToLower(r.URL.Query().Get("format"))
		if format != "" && format != "json" && format != "text" {
			http.Error(w, "format: want json or text", http.StatusBadRequest)
			return
		}
		if format == "json" || format == "" && strings.Contains(r.Header.Get("Accept"), "application/json") {
			w.Header().Set("Content-Type", "application/json")
			enc := json.NewEncoder(w)
			enc.SetIndent("", "  ")
			enc.Encode(rep)
			return
		}
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		rep.WriteText(w, g.now())
	})
}

// ReloadHandler serves POST /policy/reload: 200 when the new policy is in
// force; 409 without a configuration file; 422 with the reasons when the
// file is invalid, in which case the previous policy stays.
func (g *Guard) ReloadHandler() http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		err := g.Reload()
		switch {
		case err == nil:
			w.Write([]byte("policy reloaded\n"))
			if note := g.CapNote(); note != "" {
				w.Write([]byte(note + "\n"))
			}
		case errors.Is(err, ErrNoSource):
			http.Error(w, err.Error(), http.StatusConflict)
		default:
			http.Error(w, "policy not reloaded; the previous policy stays in force:\n"+err.Error(), http.StatusUnprocessableEntity)
		}
	})
}

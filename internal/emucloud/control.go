package emucloud

import (
	"fmt"
	"net/http"
	"time"

	etjobv1 "github.com/etjob/etjob/api/v1alpha1"
)

// Handler serves md, a node's emulated cloud metadata service, and, under
// /etjob/, the controls `etjob-local cluster reclaim` uses, the way a cloud's own
// control plane would change what its metadata service says:
//
//	POST /etjob/reclaim?provider=P&deadline=RFC3339
//	POST /etjob/early-warning?provider=P
//	POST /etjob/clear
//	POST /etjob/price?value=1.5 (the market's price; the agent's price feed reads it)
func Handler(md *Server) http.Handler {
	mux := http.NewServeMux()
	mux.Handle("/", md)
	mux.HandleFunc("POST /etjob/reclaim", func(w http.ResponseWriter, r *http.Request) {
		deadline, err := time.Parse(time.RFC3339, r.URL.Query().Get("deadline"))
		if err != nil {
			http.Error(w, "deadline: "+err.Error(), http.StatusBadRequest)
			return
		}
		if err := setNotice(func() { md.SetReclaim(r.URL.Query().Get("provider"), deadline) }); err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		w.WriteHeader(http.StatusNoContent)
	})
	mux.HandleFunc("POST /etjob/early-warning", func(w http.ResponseWriter, r *http.Request) {
		if err := setNotice(func() { md.SetEarlyWarning(r.URL.Query().Get("provider")) }); err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		w.WriteHeader(http.StatusNoContent)
	})
	mux.HandleFunc("POST /etjob/price", func(w http.ResponseWriter, r *http.Request) {
		v := r.URL.Query().Get("value")
		p, err := etjobv1.ParsePricePerHour(v)
		if err != nil {
			http.Error(w, "value: "+err.Error(), http.StatusBadRequest)
			return
		}
		md.SetSpotPrice(p.String())
		w.WriteHeader(http.StatusNoContent)
	})
	mux.HandleFunc("POST /etjob/clear", func(w http.ResponseWriter, _ *http.Request) {
		md.Clear()
		w.WriteHeader(http.StatusNoContent)
	})
	return mux
}

// setNotice turns the emulator's panic on an unknown provider into an error.
func setNotice(f func()) (err error) {
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("%v (providers: alibaba, aws, gcp, azure)", r)
		}
	}()
	f()
	return nil
}

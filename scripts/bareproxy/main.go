// Command bareproxy is the floor for any Go gateway in the overhead
// benchmark (scripts/bench-gateway-overhead.sh): a bare
// net/http/httputil.ReverseProxy with a tuned transport and nothing else.
package main

import (
	"flag"
	"log"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"time"
)

func main() {
	listen := flag.String("listen", "127.0.0.1:18100", "listen address")
	target := flag.String("target", "http://127.0.0.1:18001", "upstream base URL")
	flag.Parse()
	u, err := url.Parse(*target)
	if err != nil {
		log.Fatal(err)
	}
	p := httputil.NewSingleHostReverseProxy(u)
	p.Transport = &http.Transport{
		DialContext:         (&net.Dialer{Timeout: 2 * time.Second, KeepAlive: 30 * time.Second}).DialContext,
		MaxIdleConns:        4096,
		MaxIdleConnsPerHost: 1024,
		IdleConnTimeout:     90 * time.Second,
		DisableCompression:  true,
	}
	p.FlushInterval = -1 // stream as it arrives, as kvgate does
	log.Fatal((&http.Server{Addr: *listen, Handler: p, ReadHeaderTimeout: 10 * time.Second}).ListenAndServe())
}

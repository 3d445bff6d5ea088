package endpoints_test

import (
	"fmt"
	"net/url"

	"github.com/pgdispatch/pgdispatch/endpoints"
)

// Jobs whose URLs share a scheme, host and port share an endpoint, and so
// a circuit breaker.
func ExampleOf() {
	for _, s := range []string{
		"https://Hooks.Example.com/orders?token=s3cret",
		"https://hooks.example.com:443/refunds",
		"http://hooks.example.com/orders",
	} {
		u, _ := url.Parse(s)
		fmt.Println(endpoints.Of(u))
	}
	// Output:
	// https://hooks.example.com:443
	// https://hooks.example.com:443
	// http://hooks.example.com:80
}

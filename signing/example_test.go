package signing_test

import (
	"fmt"
	"strings"
	"time"

	"github.com/pgdispatch/pgdispatch/signing"
)

// During a rotation's overlap the old and the new secret both sign, and
// a receiver that knows either one verifies the request.
func Example() {
	old, current := signing.Generate(), signing.Generate()
	keyring := signing.NewKeyring()
	defer keyring.Stop()
	keyring.Set([]signing.Key{{ID: 1, Secret: old, ExpiresAt: time.Now().Add(time.Hour)}, {ID: 2, Secret: current}})

	id, ts, body := "msg_1", fmt.Sprint(time.Now().Unix()), []byte(`{"order": 42}`)
	var sigs []string
	for _, s := range keyring.Secrets(time.Now()) {
		sigs = append(sigs, "v1,"+signing.Sign(s, id, ts, body))
	}
	header := strings.Join(sigs, " ")
	fmt.Println(len(sigs), "signatures")
	fmt.Println("the old secret verifies:", signing.Verify(old, header, id, ts, body))
	fmt.Println("the new secret verifies:", signing.Verify(current, header, id, ts, body))
	// Output:
	// 2 signatures
	// the old secret verifies: true
	// the new secret verifies: true
}

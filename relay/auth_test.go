package relay_test

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/nats-io/jwt/v2"
	"github.com/nats-io/nkeys"
	"github.com/stretchr/testify/require"

	"github.com/pgoutbox/pgoutbox/internal/testsupport/natstest"
	"github.com/pgoutbox/pgoutbox/internal/testsupport/pgtest"
	"github.com/pgoutbox/pgoutbox/relay"
	"github.com/pgoutbox/pgoutbox/relay/natsrelay"
)

// The relay connects with each of NATS's ways to authenticate, and over
// TLS, and relays through the connection.
func TestNATSAuthentication(t *testing.T) {
	dir := t.TempDir()
	for name, setup := range map[string]func(t *testing.T) (serverConfig string, auth natsrelay.NATSConfig){
		"token": func(*testing.T) (string, natsrelay.NATSConfig) {
			return `authorization { token: "s3cret" }`, natsrelay.NATSConfig{Token: "s3cret"}
		},
		"user and password": func(*testing.T) (string, natsrelay.NATSConfig) {
			return `authorization { user: relay, password: "pa ss" }`, natsrelay.NATSConfig{User: "relay", Password: "pa ss"}
		},
		"nkey": func(t *testing.T) (string, natsrelay.NATSConfig) {
			user, err := nkeys.CreateUser()
			require.NoError(t, err)
			seed, _ := user.Seed()
			pub, _ := user.PublicKey()
			file := filepath.Join(dir, "user.nk")
			require.NoError(t, os.WriteFile(file, seed, 0o600))
			return fmt.Sprintf(`authorization { users: [ {nkey: %q} ] }`, pub), natsrelay.NATSConfig{NKeySeedFile: file}
		},
		"credentials": func(t *testing.T) (string, natsrelay.NATSConfig) {
			return credentials(t, dir)
		},
		"tls and token": func(t *testing.T) (string, natsrelay.NATSConfig) {
			cert, key, roots := serverCert(t, dir)
			return fmt.Sprintf("tls { cert_file: %q, key_file: %q }\nauthorization { token: \"s3cret\" }", cert, key),
				natsrelay.NATSConfig{Token: "s3cret", TLS: &tls.Config{RootCAs: roots, MinVersion: tls.VersionTLS12}}
		},
	} {
		t.Run(name, func(t *testing.T) {
			conf, auth := setup(t)
			e := newEnvOn(t, orderedTopic, eventsStream, natstest.Options{Config: conf}, auth)
			r := e.startRelay(t, relay.Config{})
			e.sendGroups(t, 2, 3, 6, 0, nil)
			pgtest.Eventually(t, 30*time.Second, "relayed", func() bool { return drained(t, r) })
			checkStream(t, e.readStream(t), 2, 3)
		})
	}
}

// credentials sets up operator mode: an operator, an account with
// JetStream, a user of it, and the user's credentials file.
func credentials(t *testing.T, dir string) (string, natsrelay.NATSConfig) {
	t.Helper()
	operator, err := nkeys.CreateOperator()
	require.NoError(t, err)
	opPub, _ := operator.PublicKey()
	opJWT, err := jwt.NewOperatorClaims(opPub).Encode(operator)
	require.NoError(t, err)
	account, err := nkeys.CreateAccount()
	require.NoError(t, err)
	acPub, _ := account.PublicKey()
	ac := jwt.NewAccountClaims(acPub)
	ac.Limits.JetStreamLimits = jwt.JetStreamLimits{MemoryStorage: -1, DiskStorage: -1, Streams: -1, Consumer: -1}
	acJWT, err := ac.Encode(operator)
	require.NoError(t, err)
	user, err := nkeys.CreateUser()
	require.NoError(t, err)
	uPub, _ := user.PublicKey()
	uc := jwt.NewUserClaims(uPub)
	uc.IssuerAccount = acPub
	uJWT, err := uc.Encode(account)
	require.NoError(t, err)
	seed, _ := user.Seed()
	creds, err := jwt.FormatUserConfig(uJWT, seed)
	require.NoError(t, err)
	file := filepath.Join(dir, "user.creds")
	require.NoError(t, os.WriteFile(file, creds, 0o600))
	system, err := nkeys.CreateAccount()
	require.NoError(t, err)
	sysPub, _ := system.PublicKey()
	sysJWT, err := jwt.NewAccountClaims(sysPub).Encode(operator)
	require.NoError(t, err)
	conf := fmt.Sprintf("operator: %q\nsystem_account: %s\nresolver: MEMORY\nresolver_preload: { %s: %q, %s: %q }\n",
		opJWT, sysPub, acPub, acJWT, sysPub, sysJWT)
	return conf, natsrelay.NATSConfig{CredentialsFile: file}
}

// serverCert writes a CA and a server certificate for 127.0.0.1 signed by
// it, and returns the certificate's and key's files and the CA as roots.
func serverCert(t *testing.T, dir string) (certFile, keyFile string, roots *x509.CertPool) {
	t.Helper()
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	require.NoError(t, err)
	ca := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "test CA"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign}
	caDER, err := x509.CreateCertificate(rand.Reader, ca, ca, &caKey.PublicKey, caKey)
	require.NoError(t, err)
	caCert, err := x509.ParseCertificate(caDER)
	require.NoError(t, err)
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	require.NoError(t, err)
	leaf := &x509.Certificate{SerialNumber: big.NewInt(2), Subject: pkix.Name{CommonName: "127.0.0.1"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IPAddresses: []net.IP{net.ParseIP("127.0.0.1")}, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		KeyUsage: x509.KeyUsageDigitalSignature}
	der, err := x509.CreateCertificate(rand.Reader, leaf, caCert, &key.PublicKey, caKey)
	require.NoError(t, err)
	keyDER, err := x509.MarshalECPrivateKey(key)
	require.NoError(t, err)
	certFile, keyFile = filepath.Join(dir, "server.pem"), filepath.Join(dir, "server-key.pem")
	require.NoError(t, os.WriteFile(certFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o600))
	require.NoError(t, os.WriteFile(keyFile, pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: keyDER}), 0o600))
	roots = x509.NewCertPool()
	roots.AddCert(caCert)
	return certFile, keyFile, roots
}

package main

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/rsa"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"time"
)

// pki holds the file paths of the credentials `up` generates; everything is fresh per start, so a harness
// directory never mixes credentials of two runs.
type pki struct {
	CACert, CAKey           string
	ServingCert, ServingKey string
	AdminCert, AdminKey     string
	SAKey, SAPub            string
	// The apiserver's client certificate towards kubelets (exec, logs, port-forward): the kubelet API
	// authenticates it by this CA and authorizes it by a SubjectAccessReview, like any other user.
	KubeletClientCert, KubeletClientKey string

	ca     *x509.Certificate
	caKey  crypto.Signer
	window [2]time.Time
}

func writePKI(dir string) (*pki, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, err
	}
	p := &pki{
		CACert: filepath.Join(dir, "ca.crt"), CAKey: filepath.Join(dir, "ca.key"),
		ServingCert: filepath.Join(dir, "apiserver.crt"), ServingKey: filepath.Join(dir, "apiserver.key"),
		AdminCert: filepath.Join(dir, "admin.crt"), AdminKey: filepath.Join(dir, "admin.key"),
		SAKey: filepath.Join(dir, "sa.key"), SAPub: filepath.Join(dir, "sa.pub"),
		KubeletClientCert: filepath.Join(dir, "apiserver-kubelet-client.crt"),
		KubeletClientKey:  filepath.Join(dir, "apiserver-kubelet-client.key"),
	}
	now := time.Now()
	// Backdated so that small clock differences between processes never make a fresh certificate "not yet valid".
	notBefore, notAfter := now.Add(-time.Hour), now.Add(365*24*time.Hour)

	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	caTmpl := &x509.Certificate{
		SerialNumber:          serial(),
		Subject:               pkix.Name{CommonName: "durable-sandbox-controlplane-ca"},
		NotBefore:             notBefore,
		NotAfter:              notAfter,
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature | x509.KeyUsageKeyEncipherment,
		BasicConstraintsValid: true,
		IsCA:                  true,
	}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, caKey.Public(), caKey)
	if err != nil {
		return nil, err
	}
	caCert, err := x509.ParseCertificate(caDER)
	if err != nil {
		return nil, err
	}
	if err := writeCertAndKey(p.CACert, p.CAKey, caDER, caKey); err != nil {
		return nil, err
	}
	p.ca, p.caKey, p.window = caCert, caKey, [2]time.Time{notBefore, notAfter}

	// In-cluster clients reach the apiserver as the first service IP or the kubernetes.default names.
	if err := p.issueServing("kube-apiserver", []string{"localhost", "kubernetes", "kubernetes.default",
		"kubernetes.default.svc", "kubernetes.default.svc.cluster.local"},
		[]net.IP{net.ParseIP("127.0.0.1"), net.ParseIP("::1"), net.ParseIP(serviceIP)},
		p.ServingCert, p.ServingKey); err != nil {
		return nil, err
	}

	// O=system:masters is bound to cluster-admin by the bootstrap RBAC policy and may impersonate anyone.
	if err := p.issueClient("durable-sandbox-admin", []string{"system:masters"}, p.AdminCert, p.AdminKey); err != nil {
		return nil, err
	}
	if err := p.issueClient(kubeletClientUser, nil, p.KubeletClientCert, p.KubeletClientKey); err != nil {
		return nil, err
	}

	// RSA, not ECDSA: RS256 is what every service-account token consumer is guaranteed to accept.
	saKey, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		return nil, err
	}
	saPub, err := x509.MarshalPKIXPublicKey(saKey.Public())
	if err != nil {
		return nil, err
	}
	if err := writePEM(p.SAKey, "RSA PRIVATE KEY", x509.MarshalPKCS1PrivateKey(saKey), 0o600); err != nil {
		return nil, err
	}
	if err := writePEM(p.SAPub, "PUBLIC KEY", saPub, 0o644); err != nil {
		return nil, err
	}
	return p, nil
}

// The user name the apiserver presents to kubelets; bound to ClusterRole system:kubelet-api-admin when a node starts.
const kubeletClientUser = "kube-apiserver-kubelet-client"

// issueClient writes a client certificate for user cn in groups orgs, signed by the cluster CA.
func (p *pki) issueClient(cn string, orgs []string, certPath, keyPath string) error {
	return issue(&x509.Certificate{
		SerialNumber: serial(),
		Subject:      pkix.Name{CommonName: cn, Organization: orgs},
		NotBefore:    p.window[0],
		NotAfter:     p.window[1],
		KeyUsage:     x509.KeyUsageDigitalSignature | x509.KeyUsageKeyEncipherment,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
	}, p.ca, p.caKey, certPath, keyPath)
}

// issueServing writes a serving certificate for the given names and addresses, signed by the cluster CA.
func (p *pki) issueServing(cn string, dns []string, ips []net.IP, certPath, keyPath string) error {
	return issue(&x509.Certificate{
		SerialNumber: serial(),
		Subject:      pkix.Name{CommonName: cn},
		NotBefore:    p.window[0],
		NotAfter:     p.window[1],
		KeyUsage:     x509.KeyUsageDigitalSignature | x509.KeyUsageKeyEncipherment,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		DNSNames:     dns,
		IPAddresses:  ips,
	}, p.ca, p.caKey, certPath, keyPath)
}

func issue(tmpl, ca *x509.Certificate, caKey crypto.Signer, certPath, keyPath string) error {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return err
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, key.Public(), caKey)
	if err != nil {
		return err
	}
	return writeCertAndKey(certPath, keyPath, der, key)
}

func writeCertAndKey(certPath, keyPath string, der []byte, key *ecdsa.PrivateKey) error {
	keyDER, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		return err
	}
	if err := writePEM(certPath, "CERTIFICATE", der, 0o644); err != nil {
		return err
	}
	return writePEM(keyPath, "EC PRIVATE KEY", keyDER, 0o600)
}

func writePEM(path, blockType string, der []byte, mode os.FileMode) error {
	return writeFileAtomic(path, pem.EncodeToMemory(&pem.Block{Type: blockType, Bytes: der}), mode)
}

// writeFileAtomic renames into place so that a reader polling for the file never sees it half-written.
func writeFileAtomic(path string, data []byte, mode os.FileMode) error {
	tmp := fmt.Sprintf("%s.tmp.%d", path, os.Getpid())
	if err := os.WriteFile(tmp, data, mode); err != nil {
		return err
	}
	return os.Rename(tmp, path)
}

func serial() *big.Int {
	n, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 127))
	if err != nil {
		panic(err)
	}
	return n
}

/*
This file is part of the kubevirt-qcow2 project

Licensed under the Apache License, Version 2.0 (the "License");
you may not use this file except in compliance with the License.
You may obtain a copy of the License at

    http://www.apache.org/licenses/LICENSE-2.0

Unless required by applicable law or agreed to in writing, software
distributed under the License is distributed on an "AS IS" BASIS,
WITHOUT WARRANTIES OR CONDITIONS OF ANY KIND, either express or implied.
See the License for the specific language governing permissions and
limitations under the License.

Copyright The kubevirt-qcow2 Authors.
*/

// Package s3server runs a real S3 server for the backup suites and the
// benchmark: versitygw with its posix backend, on a loopback port, storing
// into a directory the caller owns. The binary is built once into the cache
// by hack/s3-server.sh.
package s3server

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/base64"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/kubevirt-qcow2/kubevirt-qcow2/internal/testenv"
	"github.com/kubevirt-qcow2/kubevirt-qcow2/pkg/backup/objectstore"
)

// Server is a running versitygw.
type Server struct {
	URL       string
	AccessKey string
	SecretKey string
	// Root holds one directory per bucket.
	Root string
	// Log is the server's output.
	Log string
	// CACert is the PEM certificate of the authority that signed the
	// server's certificate when it serves HTTPS (StartTLS); no system
	// trusts it.
	CACert []byte
	addr   string
	cmd    *exec.Cmd
	// done is closed when the process has exited.
	done chan struct{}
}

// Binary returns the versitygw binary, building it on first use.
func Binary(ctx context.Context, repoRoot string) (string, error) {
	out, err := exec.CommandContext(ctx, filepath.Join(repoRoot, "hack", "s3-server.sh")).Output()
	if err != nil {
		var exitErr *exec.ExitError
		if errors.As(err, &exitErr) {
			return "", fmt.Errorf("hack/s3-server.sh: %w: %s", err, strings.TrimSpace(string(exitErr.Stderr)))
		}
		return "", fmt.Errorf("hack/s3-server.sh: %w", err)
	}
	return strings.TrimSpace(string(out)), nil
}

// Start runs binary storing under dir and waits until it accepts
// connections.
func Start(ctx context.Context, binary, dir string) (*Server, error) {
	return start(ctx, binary, dir, "127.0.0.1", false)
}

// StartOn is Start listening on ip, one of this machine's addresses,
// instead of loopback: for clients elsewhere, such as the one-node
// cluster's pods, which reach the host at the host end of the node's veth.
func StartOn(ctx context.Context, binary, dir, ip string) (*Server, error) {
	return start(ctx, binary, dir, ip, false)
}

// StartTLS is Start serving HTTPS with a certificate for 127.0.0.1 signed
// by a certificate authority made for this server (Server.CACert).
func StartTLS(ctx context.Context, binary, dir string) (*Server, error) {
	return start(ctx, binary, dir, "127.0.0.1", true)
}

// StartLarge is Start for objects of more than about 700 parts, as the
// benchmarks upload: versitygw keeps an object's metadata in extended
// attributes, among them the offsets of a multipart object's parts (5 KiB
// gzipped for 1024 parts), and ext4 holds no attribute larger than its
// 4 KiB block: it answers ENOSPC, which versitygw reports as 507
// InsufficientStorage. The metadata goes into files under dir instead
// (versitygw's sidecar mode, which its own tests exempt from racing
// completions of one key: the catalog's tests keep Start).
func StartLarge(ctx context.Context, binary, dir string) (*Server, error) {
	metadata := filepath.Join(dir, "metadata")
	if err := os.MkdirAll(metadata, 0o755); err != nil {
		return nil, fmt.Errorf("s3 server: %w", err)
	}
	return start(ctx, binary, dir, "127.0.0.1", false, "--sidecar", metadata)
}

func start(ctx context.Context, binary, dir, ip string, useTLS bool, posixArgs ...string) (*Server, error) {
	port, err := testenv.FreePort()
	if err != nil {
		return nil, err
	}
	scheme := "http"
	if useTLS {
		scheme = "https"
	}
	s := &Server{
		URL:       fmt.Sprintf("%s://%s", scheme, net.JoinHostPort(ip, strconv.Itoa(port))),
		AccessKey: "backuptest",
		SecretKey: "backuptest-secret",
		Root:      filepath.Join(dir, "buckets"),
		Log:       filepath.Join(dir, "versitygw.log"),
	}
	if err := os.MkdirAll(s.Root, 0o755); err != nil {
		return nil, fmt.Errorf("s3 server: %w", err)
	}
	logFile, err := os.Create(s.Log)
	if err != nil {
		return nil, fmt.Errorf("s3 server: %w", err)
	}
	defer logFile.Close()
	args := []string{"--port", net.JoinHostPort(ip, strconv.Itoa(port)), "--quiet"}
	if useTLS {
		cert, key, err := s.makeCertificates(dir)
		if err != nil {
			return nil, err
		}
		args = append(args, "--cert", cert, "--key", key)
	}
	args = append(append(args, "posix"), posixArgs...)
	s.addr = net.JoinHostPort(ip, strconv.Itoa(port))
	s.cmd = exec.Command(binary, append(args, s.Root)...)
	s.cmd.Env = append(os.Environ(), "ROOT_ACCESS_KEY_ID="+s.AccessKey, "ROOT_SECRET_ACCESS_KEY="+s.SecretKey)
	if err := s.run(ctx, logFile); err != nil {
		return nil, err
	}
	return s, nil
}

// run starts s.cmd, its output to logFile, and waits until it listens.
func (s *Server) run(ctx context.Context, logFile *os.File) error {
	s.cmd.Stdout, s.cmd.Stderr = logFile, logFile
	s.done = make(chan struct{})
	if err := s.cmd.Start(); err != nil {
		return fmt.Errorf("s3 server: start %s: %w", s.cmd.Path, err)
	}
	done := s.done
	go func() { _ = s.cmd.Wait(); close(done) }()
	if err := s.waitReady(ctx, s.addr); err != nil {
		_ = s.Stop()
		return err
	}
	return nil
}

// Kill ends the server at once, as a crash does: requests in flight are
// cut off.
func (s *Server) Kill() {
	_ = s.cmd.Process.Kill()
	<-s.done
}

// Restart starts a stopped server again on its address and data.
func (s *Server) Restart(ctx context.Context) error {
	select {
	case <-s.done:
	default:
		return fmt.Errorf("s3 server on %s still runs", s.addr)
	}
	logFile, err := os.OpenFile(s.Log, os.O_WRONLY|os.O_APPEND, 0)
	if err != nil {
		return fmt.Errorf("s3 server: %w", err)
	}
	defer logFile.Close()
	cmd := exec.Command(s.cmd.Path, s.cmd.Args[1:]...)
	cmd.Env = s.cmd.Env
	s.cmd = cmd
	return s.run(ctx, logFile)
}

func (s *Server) waitReady(ctx context.Context, addr string) error {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	for {
		conn, err := net.DialTimeout("tcp", addr, time.Second)
		if err == nil {
			conn.Close()
			return nil
		}
		select {
		case <-s.done:
			log, _ := os.ReadFile(s.Log)
			return fmt.Errorf("s3 server exited: %s", strings.TrimSpace(string(log)))
		case <-ctx.Done():
			return fmt.Errorf("s3 server on %s not ready: %w", addr, ctx.Err())
		case <-tick.C:
		}
	}
}

// Stop ends the server and waits for it.
func (s *Server) Stop() error {
	select {
	case <-s.done:
		return nil
	default:
	}
	if err := s.cmd.Process.Signal(os.Interrupt); err != nil {
		return fmt.Errorf("stop s3 server: %w", err)
	}
	select {
	case <-s.done:
	case <-time.After(10 * time.Second):
		_ = s.cmd.Process.Kill()
		<-s.done
	}
	return nil
}

// Pid is the server process's id, for reading what it used (/proc/<pid>).
func (s *Server) Pid() int { return s.cmd.Process.Pid }

// WriteCredentials writes the server's keys as an AWS credentials file,
// as Velero's credentials secret holds them, and returns its path.
func (s *Server) WriteCredentials(dir string) (string, error) {
	path := filepath.Join(dir, "credentials")
	content := fmt.Sprintf("[default]\naws_access_key_id = %s\naws_secret_access_key = %s\n", s.AccessKey, s.SecretKey)
	if err := os.WriteFile(path, []byte(content), 0o600); err != nil {
		return "", fmt.Errorf("write credentials: %w", err)
	}
	return path, nil
}

// Config is a BSL configuration for bucket on this server, trusting its
// certificate authority when it serves HTTPS.
func (s *Server) Config(bucket, prefix, credentials string) objectstore.Config {
	return objectstore.Config{Bucket: bucket, Prefix: prefix, Region: "us-east-1", S3URL: s.URL,
		S3ForcePathStyle: true, CredentialsFile: credentials, CACert: s.CACert}
}

// BSL is a BackupStorageLocation manifest for bucket on this server, with
// its certificate authority in spec.objectStorage.caCert when it serves
// HTTPS.
func (s *Server) BSL(bucket, prefix string) string {
	caCert := ""
	if len(s.CACert) > 0 {
		caCert = "\n    caCert: " + base64.StdEncoding.EncodeToString(s.CACert)
	}
	return fmt.Sprintf(`apiVersion: velero.io/v1
kind: BackupStorageLocation
metadata:
  name: default
  namespace: velero
spec:
  provider: aws
  objectStorage:
    bucket: %s
    prefix: %s%s
  config:
    region: us-east-1
    s3Url: %s
    s3ForcePathStyle: "true"
`, bucket, prefix, caCert, s.URL)
}

// makeCertificates makes a certificate authority (kept in s.CACert) and a
// server certificate for 127.0.0.1 it signs, and writes the server's
// certificate and key under dir.
func (s *Server) makeCertificates(dir string) (certFile, keyFile string, err error) {
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return "", "", fmt.Errorf("s3 server: CA key: %w", err)
	}
	now := time.Now()
	caTemplate := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "s3server test CA"},
		NotBefore: now.Add(-time.Hour), NotAfter: now.Add(24 * time.Hour),
		KeyUsage: x509.KeyUsageCertSign | x509.KeyUsageCRLSign, BasicConstraintsValid: true, IsCA: true,
	}
	caDER, err := x509.CreateCertificate(rand.Reader, caTemplate, caTemplate, &caKey.PublicKey, caKey)
	if err != nil {
		return "", "", fmt.Errorf("s3 server: CA certificate: %w", err)
	}
	ca, err := x509.ParseCertificate(caDER)
	if err != nil {
		return "", "", fmt.Errorf("s3 server: CA certificate: %w", err)
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return "", "", fmt.Errorf("s3 server: key: %w", err)
	}
	template := &x509.Certificate{
		SerialNumber: big.NewInt(2), Subject: pkix.Name{CommonName: "127.0.0.1"},
		NotBefore: now.Add(-time.Hour), NotAfter: now.Add(24 * time.Hour),
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1)},
	}
	der, err := x509.CreateCertificate(rand.Reader, template, ca, &key.PublicKey, caKey)
	if err != nil {
		return "", "", fmt.Errorf("s3 server: certificate: %w", err)
	}
	keyDER, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		return "", "", fmt.Errorf("s3 server: key: %w", err)
	}
	certFile, keyFile = filepath.Join(dir, "tls.crt"), filepath.Join(dir, "tls.key")
	if err := os.WriteFile(certFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o644); err != nil {
		return "", "", fmt.Errorf("s3 server: %w", err)
	}
	if err := os.WriteFile(keyFile, pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: keyDER}), 0o600); err != nil {
		return "", "", fmt.Errorf("s3 server: %w", err)
	}
	s.CACert = pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: caDER})
	return certFile, keyFile, nil
}

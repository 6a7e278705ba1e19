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

package sidecar

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"slices"
	"sync"

	"google.golang.org/grpc"

	hooksinfo "kubevirt.io/kubevirt/pkg/hooks/info"
	"kubevirt.io/kubevirt/pkg/hooks/v1alpha2"
	"kubevirt.io/kubevirt/pkg/hooks/v1alpha3"
)

// Name is the hook's name in its Info answer.
const Name = "overlay"

// Versions are the hook API versions the server implements, newest first;
// virt-launcher uses the newest it knows.
var Versions = []string{v1alpha3.Version, v1alpha2.Version}

// HookPoints are the hook points the server can subscribe to.
var HookPoints = []string{
	hooksinfo.OnDefineDomainHookPointName,
	hooksinfo.PreCloudInitIsoHookPointName,
	hooksinfo.ShutdownHookPointName,
}

// ServerConfig selects what the server announces.
type ServerConfig struct {
	// Versions to announce, a subset of Versions; all when empty.
	Versions []string
	// HookPoints to subscribe to, a subset of HookPoints. Shutdown is
	// only announced with v1alpha3, which has it.
	HookPoints []string
}

// Server serves the hook on a unix socket.
type Server struct {
	hook     *Hook
	versions []string
	points   []string
	grpc     *grpc.Server
	// shutdown is closed when virt-launcher calls Shutdown.
	shutdown chan struct{}
	once     sync.Once
}

// NewServer checks cfg and returns a server for hook.
func NewServer(hook *Hook, cfg ServerConfig) (*Server, error) {
	versions := cfg.Versions
	if len(versions) == 0 {
		versions = Versions
	}
	for _, v := range versions {
		if !slices.Contains(Versions, v) {
			return nil, fmt.Errorf("hook API version %q is not one of %v", v, Versions)
		}
	}
	var points []string
	for _, p := range cfg.HookPoints {
		if !slices.Contains(HookPoints, p) {
			return nil, fmt.Errorf("hook point %q is not one of %v", p, HookPoints)
		}
		if p == hooksinfo.ShutdownHookPointName && !slices.Contains(versions, v1alpha3.Version) {
			continue
		}
		points = append(points, p)
	}
	if !slices.Contains(points, hooksinfo.OnDefineDomainHookPointName) {
		return nil, fmt.Errorf("hook point %s is required: it is what this hook is for", hooksinfo.OnDefineDomainHookPointName)
	}
	s := &Server{hook: hook, versions: versions, points: points, shutdown: make(chan struct{})}
	s.grpc = grpc.NewServer()
	hooksinfo.RegisterInfoServer(s.grpc, infoServer{s})
	if slices.Contains(versions, v1alpha2.Version) {
		v1alpha2.RegisterCallbacksServer(s.grpc, v1alpha2Server{s})
	}
	if slices.Contains(versions, v1alpha3.Version) {
		v1alpha3.RegisterCallbacksServer(s.grpc, v1alpha3Server{s})
	}
	return s, nil
}

// Serve listens on socketPath and serves until ctx is done or
// virt-launcher calls Shutdown; it removes the socket when it returns.
func (s *Server) Serve(ctx context.Context, socketPath string) error {
	if err := os.Remove(socketPath); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("serve hook on %s: %w", socketPath, err)
	}
	lis, err := net.Listen("unix", socketPath)
	if err != nil {
		return fmt.Errorf("serve hook on %s: %w", socketPath, err)
	}
	defer os.Remove(socketPath)
	errc := make(chan error, 1)
	go func() { errc <- s.grpc.Serve(lis) }()
	select {
	case err := <-errc:
		return fmt.Errorf("serve hook on %s: %w", socketPath, err)
	case <-ctx.Done():
	case <-s.shutdown:
	}
	s.grpc.GracefulStop()
	<-errc //nolint:errcheck // Serve has returned; its error after GracefulStop is not one
	return nil
}

func (s *Server) onDefineDomain(ctx context.Context, vmi, domain []byte) ([]byte, error) {
	out, err := s.hook.OnDefineDomain(ctx, vmi, domain)
	if err != nil {
		s.hook.Log.Error(err, "OnDefineDomain failed")
		return nil, fmt.Errorf("overlay hook: %w", err)
	}
	return out, nil
}

func (s *Server) stop() error {
	err := s.hook.Shutdown()
	s.once.Do(func() { close(s.shutdown) })
	return err
}

type infoServer struct{ s *Server }

func (i infoServer) Info(context.Context, *hooksinfo.InfoParams) (*hooksinfo.InfoResult, error) {
	res := &hooksinfo.InfoResult{Name: Name, Versions: i.s.versions}
	for _, p := range i.s.points {
		res.HookPoints = append(res.HookPoints, &hooksinfo.HookPoint{Name: p})
	}
	return res, nil
}

type v1alpha3Server struct{ s *Server }

func (v v1alpha3Server) OnDefineDomain(ctx context.Context, p *v1alpha3.OnDefineDomainParams) (*v1alpha3.OnDefineDomainResult, error) {
	out, err := v.s.onDefineDomain(ctx, p.GetVmi(), p.GetDomainXML())
	if err != nil {
		return nil, err
	}
	return &v1alpha3.OnDefineDomainResult{DomainXML: out}, nil
}

// PreCloudInitIso passes the cloud-init data through unchanged.
func (v v1alpha3Server) PreCloudInitIso(_ context.Context, p *v1alpha3.PreCloudInitIsoParams) (*v1alpha3.PreCloudInitIsoResult, error) {
	return &v1alpha3.PreCloudInitIsoResult{
		CloudInitData:          p.GetCloudInitData(),
		CloudInitNoCloudSource: p.GetCloudInitNoCloudSource(),
	}, nil
}

func (v v1alpha3Server) Shutdown(context.Context, *v1alpha3.ShutdownParams) (*v1alpha3.ShutdownResult, error) {
	if err := v.s.stop(); err != nil {
		return nil, fmt.Errorf("overlay hook: %w", err)
	}
	return &v1alpha3.ShutdownResult{}, nil
}

type v1alpha2Server struct{ s *Server }

func (v v1alpha2Server) OnDefineDomain(ctx context.Context, p *v1alpha2.OnDefineDomainParams) (*v1alpha2.OnDefineDomainResult, error) {
	out, err := v.s.onDefineDomain(ctx, p.GetVmi(), p.GetDomainXML())
	if err != nil {
		return nil, err
	}
	return &v1alpha2.OnDefineDomainResult{DomainXML: out}, nil
}

// PreCloudInitIso passes the cloud-init data through unchanged.
func (v v1alpha2Server) PreCloudInitIso(_ context.Context, p *v1alpha2.PreCloudInitIsoParams) (*v1alpha2.PreCloudInitIsoResult, error) {
	return &v1alpha2.PreCloudInitIsoResult{
		CloudInitData:          p.GetCloudInitData(),
		CloudInitNoCloudSource: p.GetCloudInitNoCloudSource(),
	}, nil
}

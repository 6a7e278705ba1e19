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
	"path/filepath"

	"github.com/go-logr/logr"
	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	hooksinfo "kubevirt.io/kubevirt/pkg/hooks/info"
	"kubevirt.io/kubevirt/pkg/hooks/v1alpha2"
	"kubevirt.io/kubevirt/pkg/hooks/v1alpha3"

	"github.com/kubevirt-qcow2/kubevirt-qcow2/pkg/overlay"
)

var _ = Describe("Server", func() {
	DescribeTable("announces what it was configured for",
		func(cfg ServerConfig, versions, points []string) {
			s, err := NewServer(NewHook(Environment{}, overlay.Native{}, logr.Discard()), cfg)
			Expect(err).ToNot(HaveOccurred())
			info := serveAndCall(s, func(conn *grpc.ClientConn) any {
				res, err := hooksinfo.NewInfoClient(conn).Info(context.Background(), &hooksinfo.InfoParams{})
				Expect(err).ToNot(HaveOccurred())
				return res
			}).(*hooksinfo.InfoResult)
			Expect(info.GetName()).To(Equal(Name))
			Expect(info.GetVersions()).To(Equal(versions))
			var names []string
			for _, p := range info.GetHookPoints() {
				names = append(names, p.GetName())
			}
			Expect(names).To(Equal(points))
		},
		Entry("both versions by default", ServerConfig{HookPoints: []string{"OnDefineDomain", "Shutdown"}},
			[]string{"v1alpha3", "v1alpha2"}, []string{"OnDefineDomain", "Shutdown"}),
		Entry("every hook point", ServerConfig{HookPoints: HookPoints},
			[]string{"v1alpha3", "v1alpha2"}, []string{"OnDefineDomain", "PreCloudInitIso", "Shutdown"}),
		Entry("no Shutdown without v1alpha3", ServerConfig{Versions: []string{"v1alpha2"}, HookPoints: []string{"OnDefineDomain", "Shutdown"}},
			[]string{"v1alpha2"}, []string{"OnDefineDomain"}),
	)

	DescribeTable("refuses a configuration it cannot serve",
		func(cfg ServerConfig, message string) {
			_, err := NewServer(NewHook(Environment{}, overlay.Native{}, logr.Discard()), cfg)
			Expect(err).To(MatchError(ContainSubstring(message)))
		},
		Entry("an unknown version", ServerConfig{Versions: []string{"v1alpha1"}, HookPoints: []string{"OnDefineDomain"}}, `"v1alpha1" is not one of`),
		Entry("an unknown hook point", ServerConfig{HookPoints: []string{"OnDefineDomain", "PreStart"}}, `"PreStart" is not one of`),
		Entry("no OnDefineDomain", ServerConfig{HookPoints: []string{"Shutdown"}}, "OnDefineDomain is required"),
	)

	It("passes cloud-init data through in both versions", func() {
		s, err := NewServer(NewHook(Environment{}, overlay.Native{}, logr.Discard()), ServerConfig{HookPoints: HookPoints})
		Expect(err).ToNot(HaveOccurred())
		data, legacy := []byte(`{"userData":"#cloud-config\n"}`), []byte(`{"userData":"x"}`)
		serveAndCall(s, func(conn *grpc.ClientConn) any {
			r3, err := v1alpha3.NewCallbacksClient(conn).PreCloudInitIso(context.Background(),
				&v1alpha3.PreCloudInitIsoParams{CloudInitData: data, CloudInitNoCloudSource: legacy, Vmi: []byte("{}")})
			Expect(err).ToNot(HaveOccurred())
			Expect(r3.GetCloudInitData()).To(Equal(data))
			Expect(r3.GetCloudInitNoCloudSource()).To(Equal(legacy))
			r2, err := v1alpha2.NewCallbacksClient(conn).PreCloudInitIso(context.Background(),
				&v1alpha2.PreCloudInitIsoParams{CloudInitData: data, CloudInitNoCloudSource: legacy, Vmi: []byte("{}")})
			Expect(err).ToNot(HaveOccurred())
			Expect(r2.GetCloudInitData()).To(Equal(data))
			return nil
		})
	})

	It("returns OnDefineDomain's error to the caller", func() {
		s, err := NewServer(NewHook(Environment{}, overlay.Native{}, logr.Discard()), ServerConfig{HookPoints: HookPoints})
		Expect(err).ToNot(HaveOccurred())
		serveAndCall(s, func(conn *grpc.ClientConn) any {
			_, err := v1alpha3.NewCallbacksClient(conn).OnDefineDomain(context.Background(),
				&v1alpha3.OnDefineDomainParams{Vmi: []byte(`{"metadata":{"name":"vm1"}}`), DomainXML: []byte("<domain/>")})
			Expect(err).To(MatchError(ContainSubstring("has no annotation " + AnnotationKey)))
			return nil
		})
	})

	It("stops serving after Shutdown", func() {
		s, err := NewServer(NewHook(Environment{}, overlay.Native{}, logr.Discard()), ServerConfig{HookPoints: HookPoints})
		Expect(err).ToNot(HaveOccurred())
		socket := filepath.Join(GinkgoT().TempDir(), "hook.sock")
		done := make(chan error, 1)
		go func() { done <- s.Serve(context.Background(), socket) }()
		conn := dial(socket)
		defer conn.Close()
		Eventually(func() error {
			_, err := v1alpha3.NewCallbacksClient(conn).Shutdown(context.Background(), &v1alpha3.ShutdownParams{})
			return err
		}).Should(Succeed())
		Eventually(done).Should(Receive(BeNil()))
		Expect(socket).ToNot(BeAnExistingFile())
	})
})

// serveAndCall serves s on a fresh socket, runs call with a connection to
// it, and stops the server.
func serveAndCall(s *Server, call func(*grpc.ClientConn) any) any {
	GinkgoHelper()
	socket := filepath.Join(GinkgoT().TempDir(), "hook.sock")
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.Serve(ctx, socket) }()
	DeferCleanup(func() {
		cancel()
		Eventually(done).Should(Receive(BeNil()))
	})
	Eventually(func() string { return socket }).Should(BeAnExistingFile())
	conn := dial(socket)
	defer conn.Close()
	return call(conn)
}

func dial(socket string) *grpc.ClientConn {
	GinkgoHelper()
	conn, err := grpc.NewClient("unix://"+socket, grpc.WithTransportCredentials(insecure.NewCredentials()))
	Expect(err).ToNot(HaveOccurred())
	return conn
}

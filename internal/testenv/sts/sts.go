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

// Package sts stands in for AWS STS in tests.
package sts

import (
	"encoding/xml"
	"net/http"
	"net/http/httptest"
	"sync"
	"time"
)

// Server stands in for AWS STS's AssumeRoleWithWebIdentity on loopback,
// which the test S3 server lacks: it hands out fixed keys (the S3
// server's) for any token and role, and records what it was asked.
type Server struct {
	URL    string
	server *httptest.Server

	mu       sync.Mutex
	requests []Request
}

// Request is what a client sent.
type Request struct {
	RoleARN, RoleSessionName, Token string
}

// Start starts an STS that exchanges any web identity for the keys
// accessKey and secretKey, valid for an hour.
func Start(accessKey, secretKey string) *Server {
	s := &Server{}
	s.server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if err := r.ParseForm(); err != nil || r.Form.Get("Action") != "AssumeRoleWithWebIdentity" {
			refuse(w, "InvalidAction", "not an AssumeRoleWithWebIdentity request")
			return
		}
		req := Request{RoleARN: r.Form.Get("RoleArn"), RoleSessionName: r.Form.Get("RoleSessionName"),
			Token: r.Form.Get("WebIdentityToken")}
		s.mu.Lock()
		s.requests = append(s.requests, req)
		s.mu.Unlock()
		if req.Token == "" || req.RoleARN == "" {
			refuse(w, "InvalidIdentityToken", "missing WebIdentityToken or RoleArn")
			return
		}
		var resp struct {
			XMLName     xml.Name `xml:"https://sts.amazonaws.com/doc/2011-06-15/ AssumeRoleWithWebIdentityResponse"`
			Credentials struct {
				AccessKeyID     string    `xml:"AccessKeyId"`
				SecretAccessKey string    `xml:"SecretAccessKey"`
				Expiration      time.Time `xml:"Expiration"`
			} `xml:"AssumeRoleWithWebIdentityResult>Credentials"`
		}
		resp.Credentials.AccessKeyID, resp.Credentials.SecretAccessKey = accessKey, secretKey
		resp.Credentials.Expiration = time.Now().Add(time.Hour).UTC()
		w.Header().Set("Content-Type", "text/xml")
		_ = xml.NewEncoder(w).Encode(resp)
	}))
	s.URL = s.server.URL
	return s
}

// refuse answers as STS refuses: an ErrorResponse document.
func refuse(w http.ResponseWriter, code, message string) {
	var resp struct {
		XMLName xml.Name `xml:"https://sts.amazonaws.com/doc/2011-06-15/ ErrorResponse"`
		Type    string   `xml:"Error>Type"`
		Code    string   `xml:"Error>Code"`
		Message string   `xml:"Error>Message"`
	}
	resp.Type, resp.Code, resp.Message = "Sender", code, message
	w.Header().Set("Content-Type", "text/xml")
	w.WriteHeader(http.StatusBadRequest)
	_ = xml.NewEncoder(w).Encode(resp)
}

// Requests are the requests it answered or refused, oldest first.
func (s *Server) Requests() []Request {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]Request(nil), s.requests...)
}

// Close stops it.
func (s *Server) Close() { s.server.Close() }

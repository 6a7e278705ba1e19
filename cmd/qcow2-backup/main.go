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

// Command qcow2-backup backs up the qcow2 disks of a running libvirt domain
// into an S3 bucket — full, then incremental from libvirt checkpoints — and
// lists, restores and deletes those backups, in the object layout the
// KubeVirt datamover uses, without Velero.
package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/signal"
	"regexp"
	"sort"
	"strings"
	"sync"
	"syscall"
	"text/tabwriter"
	"time"

	"github.com/dustin/go-humanize"
	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
	"k8s.io/client-go/tools/clientcmd"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"

	"github.com/kubevirt-qcow2/kubevirt-qcow2/internal/logging"
	"github.com/kubevirt-qcow2/kubevirt-qcow2/pkg/backup"
	"github.com/kubevirt-qcow2/kubevirt-qcow2/pkg/backup/catalog"
	"github.com/kubevirt-qcow2/kubevirt-qcow2/pkg/backup/domain"
	"github.com/kubevirt-qcow2/kubevirt-qcow2/pkg/backup/objectstore"
	"github.com/kubevirt-qcow2/kubevirt-qcow2/pkg/datamover"
)

func main() {
	log, err := logging.New(logging.Options{})
	if err != nil {
		fmt.Fprintln(os.Stderr, "qcow2-backup:", err)
		os.Exit(1)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	ctx = logging.Setup(ctx, log)
	cmd := newCommand(os.Stdout, os.Stderr)
	cmd.SetArgs(longFlags(os.Args[1:]))
	err = cmd.ExecuteContext(ctx)
	stop()
	if err != nil {
		fmt.Fprintln(os.Stderr, "qcow2-backup:", err)
		os.Exit(1)
	}
}

// oldFlag is a long flag written with one dash, as earlier releases (Go's
// flag package) took them: "-bsl", "-grace=1h".
var oldFlag = regexp.MustCompile(`^-[a-z][a-z0-9]*(-[a-z0-9]+)*(=.*)?$`)

// longFlags keeps the command lines of earlier releases working: a long
// flag written with one dash gets the second. One-letter flags (-o, -h) and
// values such as "-1s" are left alone.
func longFlags(args []string) []string {
	out := make([]string, len(args))
	for i, a := range args {
		name, _, _ := strings.Cut(a, "=")
		if len(name) > 2 && oldFlag.MatchString(a) {
			a = "-" + a
		}
		out[i] = a
		if a == "--" {
			copy(out[i+1:], args[i+1:])
			break
		}
	}
	return out
}

func newCommand(stdout, stderr io.Writer) *cobra.Command {
	st := &storage{}
	root := &cobra.Command{
		Use:   "qcow2-backup",
		Short: "Incremental qcow2 backups of libvirt domains in S3, in the KubeVirt datamover's layout",
		Long: `qcow2-backup backs up a running libvirt domain's qcow2 disks into an S3
bucket — full, then incremental from libvirt checkpoints — and lists,
restores and deletes those backups, in the object layout the KubeVirt
datamover uses, without Velero.

The bucket comes from a Velero BackupStorageLocation: a manifest file
(--bsl, with --credentials) or one read from the cluster by name
(--bsl-name, with its credentials secret), or from the flags alone.`,
		SilenceUsage:  true,
		SilenceErrors: true,
	}
	root.SetOut(stdout)
	root.SetErr(stderr)
	st.addFlags(root.PersistentFlags())
	root.AddCommand(backupCommand(st), listCommand(st), restoreCommand(st), deleteCommand(st), gcCommand(st))
	return root
}

// storage holds the flags that locate the bucket.
type storage struct {
	bsl, credentials, caCert      string
	bslName, veleroNS, kubeconfig string
	cfg                           objectstore.Config
	flags                         *pflag.FlagSet
}

func (s *storage) addFlags(fs *pflag.FlagSet) {
	s.flags = fs
	fs.StringVar(&s.bsl, "bsl", "", "Velero BackupStorageLocation manifest (YAML) to read the bucket settings from")
	fs.StringVar(&s.bslName, "bsl-name", "", "read the BackupStorageLocation of this name, and its credentials secret, from the cluster")
	fs.StringVar(&s.veleroNS, "velero-namespace", "velero", "Velero's namespace, where --bsl-name is looked up")
	fs.StringVar(&s.kubeconfig, "kubeconfig", "", "kubeconfig for --bsl-name (default: $KUBECONFIG, else ~/.kube/config, else in-cluster)")
	fs.StringVar(&s.credentials, "credentials", "", "credentials file in AWS profile format (the BSL secret's content)")
	fs.StringVar(&s.caCert, "cacert", "", "PEM bundle of authorities to trust for the endpoint (instead of the BSL's caCert)")
	fs.StringVar(&s.cfg.Profile, "profile", "", `profile of the credentials file (default "default")`)
	fs.StringVar(&s.cfg.Bucket, "bucket", "", "bucket (overrides the BSL)")
	fs.StringVar(&s.cfg.Prefix, "prefix", "", "the location's prefix in the bucket (overrides the BSL)")
	fs.StringVar(&s.cfg.Region, "region", "", "region (overrides the BSL)")
	fs.StringVar(&s.cfg.S3URL, "s3-url", "", "S3 endpoint, http(s)://host:port (overrides the BSL)")
	fs.BoolVar(&s.cfg.S3ForcePathStyle, "s3-force-path-style", false, "path-style bucket addressing (overrides the BSL)")
	fs.BoolVar(&s.cfg.InsecureSkipTLSVerify, "insecure-skip-tls-verify", false, "do not verify the endpoint's certificate (overrides the BSL)")
}

// config is the bucket's settings: the location's, with the flags given
// on the command line over them.
func (s *storage) config(ctx context.Context) (objectstore.Config, error) {
	cfg := s.cfg
	var err error
	switch {
	case s.bsl != "" && s.bslName != "":
		return cfg, fmt.Errorf("--bsl and --bsl-name exclude each other")
	case s.bsl != "":
		if cfg, err = objectstore.LoadBSL(s.bsl, s.credentials); err != nil {
			return cfg, err
		}
	case s.bslName != "":
		if cfg, err = s.fromCluster(ctx); err != nil {
			return cfg, err
		}
	}
	if s.bsl != "" || s.bslName != "" {
		for name, set := range map[string]func(){
			"bucket":                   func() { cfg.Bucket = s.cfg.Bucket },
			"prefix":                   func() { cfg.Prefix = s.cfg.Prefix },
			"region":                   func() { cfg.Region = s.cfg.Region },
			"s3-url":                   func() { cfg.S3URL = s.cfg.S3URL },
			"s3-force-path-style":      func() { cfg.S3ForcePathStyle = s.cfg.S3ForcePathStyle },
			"insecure-skip-tls-verify": func() { cfg.InsecureSkipTLSVerify = s.cfg.InsecureSkipTLSVerify },
			"profile":                  func() { cfg.Profile = s.cfg.Profile },
		} {
			if s.flags.Changed(name) {
				set()
			}
		}
	}
	if s.credentials != "" || s.bslName == "" {
		cfg.CredentialsFile, cfg.CredentialsData = s.credentials, nil
	}
	if s.caCert != "" {
		if cfg.CACert, err = os.ReadFile(s.caCert); err != nil {
			return cfg, fmt.Errorf("--cacert: %w", err)
		}
	}
	return cfg, nil
}

// fromCluster reads --bsl-name and its credentials secret through the
// kubeconfig, as the datamover controller reads them.
func (s *storage) fromCluster(ctx context.Context) (objectstore.Config, error) {
	rules := clientcmd.NewDefaultClientConfigLoadingRules()
	rules.ExplicitPath = s.kubeconfig
	restCfg, err := clientcmd.NewNonInteractiveDeferredLoadingClientConfig(rules, &clientcmd.ConfigOverrides{}).ClientConfig()
	if err != nil {
		return objectstore.Config{}, fmt.Errorf("kubeconfig: %w", err)
	}
	scheme, err := datamover.NewScheme()
	if err != nil {
		return objectstore.Config{}, err
	}
	c, err := client.New(restCfg, client.Options{Scheme: scheme})
	if err != nil {
		return objectstore.Config{}, fmt.Errorf("kubeconfig: %w", err)
	}
	return datamover.LocationConfig(ctx, c, s.veleroNS, s.bslName)
}

func (s *storage) repository(ctx context.Context) (*backup.Repository, error) {
	cfg, err := s.config(ctx)
	if err != nil {
		return nil, err
	}
	return backup.Open(cfg)
}

func vmFlags(fs *pflag.FlagSet) *catalog.VM {
	vm := &catalog.VM{}
	fs.StringVar(&vm.Namespace, "namespace", "default", "namespace the VM's backups are filed under")
	fs.StringVar(&vm.Name, "vm", "", "VM name the backups are filed under")
	return vm
}

// output is the -o flag: every command that prints a result takes it.
type output string

func outputFlag(fs *pflag.FlagSet) *output {
	o := output("table")
	fs.VarP(&o, "output", "o", "output format: table, json or yaml")
	return &o
}

func (o *output) String() string { return string(*o) }
func (o *output) Type() string   { return "format" }
func (o *output) Set(v string) error {
	switch v {
	case "table", "json", "yaml":
		*o = output(v)
		return nil
	}
	return fmt.Errorf("%q: want table, json or yaml", v)
}

// print writes v as JSON or YAML, or calls table.
func (o output) print(w io.Writer, v any, table func() error) error {
	switch o {
	case "json":
		enc := json.NewEncoder(w)
		enc.SetIndent("", "  ")
		return enc.Encode(v)
	case "yaml":
		data, err := yaml.Marshal(v)
		if err != nil {
			return err
		}
		_, err = w.Write(data)
		return err
	}
	return table()
}

func backupCommand(st *storage) *cobra.Command {
	var (
		uri, dom, name, disks, workDir string
		forceFull, verify              bool
		maxChain                       int
	)
	cmd := &cobra.Command{
		Use:   "backup --domain DOMAIN --backup NAME",
		Short: "Back up a running libvirt domain's qcow2 disks",
		Args:  cobra.NoArgs,
	}
	vm := vmFlags(cmd.Flags())
	cmd.Flags().StringVar(&uri, "uri", os.Getenv("LIBVIRT_DEFAULT_URI"), "libvirt connection URI")
	cmd.Flags().StringVar(&dom, "domain", "", "libvirt domain to back up")
	cmd.Flags().StringVar(&name, "backup", "", "backup name")
	cmd.Flags().StringVar(&disks, "disks", "", "comma-separated disk targets (default: every qcow2 disk)")
	cmd.Flags().BoolVar(&forceFull, "force-full", false, "take a full backup whatever the store holds")
	cmd.Flags().IntVar(&maxChain, "max-chain", 0, "maximum layers of a chain; a longer one starts over with a full backup (0: no limit)")
	cmd.Flags().BoolVar(&verify, "verify-content", false, "read back the whole parent chain and check its digests before an incremental")
	cmd.Flags().StringVar(&workDir, "work-dir", "", "directory for libvirt's backup files until they are uploaded")
	out := outputFlag(cmd.Flags())
	_ = cmd.MarkFlagRequired("domain")
	_ = cmd.MarkFlagRequired("backup")
	cmd.RunE = func(cmd *cobra.Command, _ []string) error {
		ctx := cmd.Context()
		if vm.Name == "" {
			vm.Name = dom
		}
		repo, err := st.repository(ctx)
		if err != nil {
			return err
		}
		d, err := domain.Open(uri, dom)
		if err != nil {
			return err
		}
		defer d.Close()
		if disks != "" {
			d.Disks = strings.Split(disks, ",")
		}
		p := newProgress(cmd.ErrOrStderr(), "upload")
		res, err := repo.BackupVM(ctx, *vm, d, backup.BackupOptions{
			Backup: name, WorkDir: workDir, Progress: p.report,
			Plan: backup.PlanOptions{ForceFull: forceFull, MaxChainLength: maxChain, VerifyContent: verify},
		})
		if err != nil {
			return err
		}
		c := res.Checkpoint
		b := backedUp{Backup: name, Namespace: vm.Namespace, VM: vm.Name, Checkpoint: c.ID, Type: c.Type,
			Parent: c.Parent, BytesUploaded: res.Uploaded, FullReason: res.Plan.Reason}
		return out.print(cmd.OutOrStdout(), b, func() error { return b.table(cmd.OutOrStdout()) })
	}
	return cmd
}

// backedUp is what backup prints.
type backedUp struct {
	Backup        string                 `json:"backup"`
	Namespace     string                 `json:"namespace"`
	VM            string                 `json:"vm"`
	Checkpoint    string                 `json:"checkpoint"`
	Type          catalog.CheckpointType `json:"type"`
	Parent        string                 `json:"parent,omitempty"`
	BytesUploaded int64                  `json:"bytesUploaded"`
	FullReason    string                 `json:"fullReason,omitempty"`
}

func (b backedUp) table(w io.Writer) error {
	fmt.Fprintf(w, "backup %s of %s/%s: %s checkpoint %s", b.Backup, b.Namespace, b.VM, b.Type, b.Checkpoint)
	if b.Parent != "" {
		fmt.Fprintf(w, " (parent %s)", b.Parent)
	}
	fmt.Fprintf(w, ", %s uploaded\n", size(b.BytesUploaded))
	if b.FullReason != "" {
		fmt.Fprintf(w, "full because: %s\n", b.FullReason)
	}
	return nil
}

// listing is what list prints as JSON or YAML.
type listing struct {
	Backups     []listedBackup     `json:"backups"`
	Checkpoints []listedCheckpoint `json:"checkpoints"`
}

type listedBackup struct {
	Name      string       `json:"name"`
	Timestamp time.Time    `json:"timestamp"`
	VMs       []listedVMAt `json:"vms"`
}

type listedVMAt struct {
	Namespace  string `json:"namespace"`
	Name       string `json:"name"`
	Checkpoint string `json:"checkpoint"`
}

type listedCheckpoint struct {
	Namespace    string                  `json:"namespace"`
	VM           string                  `json:"vm"`
	ID           string                  `json:"id"`
	Type         catalog.CheckpointType  `json:"type"`
	Parent       string                  `json:"parent,omitempty"`
	State        catalog.CheckpointState `json:"state"`
	Timestamp    time.Time               `json:"timestamp"`
	Bytes        int64                   `json:"bytes"`
	ReferencedBy []string                `json:"referencedBy"`
}

func listCommand(st *storage) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "list [--namespace NS --vm VM]",
		Short: "List backups and each VM's checkpoints",
		Args:  cobra.NoArgs,
	}
	vm := vmFlags(cmd.Flags())
	out := outputFlag(cmd.Flags())
	cmd.RunE = func(cmd *cobra.Command, _ []string) error {
		ctx := cmd.Context()
		repo, err := st.repository(ctx)
		if err != nil {
			return err
		}
		l, err := list(ctx, repo, vm)
		if err != nil {
			return err
		}
		return out.print(cmd.OutOrStdout(), l, func() error { return l.table(cmd.OutOrStdout()) })
	}
	return cmd
}

func list(ctx context.Context, repo *backup.Repository, vm *catalog.VM) (*listing, error) {
	l := &listing{Backups: []listedBackup{}, Checkpoints: []listedCheckpoint{}}
	backups, err := repo.Backups(ctx)
	if err != nil {
		return nil, err
	}
	for _, b := range backups {
		lb := listedBackup{Name: b.BackupName, Timestamp: b.Timestamp, VMs: []listedVMAt{}}
		for _, v := range b.VMs {
			lb.VMs = append(lb.VMs, listedVMAt{Namespace: v.Namespace, Name: v.Name, Checkpoint: v.CheckpointID})
		}
		l.Backups = append(l.Backups, lb)
	}
	vms := []catalog.VM{*vm}
	if vm.Name == "" {
		if vms, err = repo.VMs(ctx); err != nil {
			return nil, err
		}
	}
	for _, v := range vms {
		idx, err := repo.Index(ctx, v)
		if err != nil {
			return nil, err
		}
		sort.SliceStable(idx.Checkpoints, func(i, j int) bool { return idx.Checkpoints[i].Timestamp.Before(idx.Checkpoints[j].Timestamp) })
		for _, c := range idx.Checkpoints {
			lc := listedCheckpoint{Namespace: v.Namespace, VM: v.Name, ID: c.ID, Type: c.Type, Parent: c.Parent,
				State: c.State, Timestamp: c.Timestamp, ReferencedBy: c.ReferencedBy}
			if lc.State == "" {
				lc.State = catalog.Complete
			}
			if lc.ReferencedBy == nil {
				lc.ReferencedBy = []string{}
			}
			for _, f := range c.Files {
				lc.Bytes += f.Size
			}
			l.Checkpoints = append(l.Checkpoints, lc)
		}
	}
	return l, nil
}

func (l *listing) table(out io.Writer) error {
	w := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
	fmt.Fprintln(w, "BACKUP\tVM\tCHECKPOINT")
	for _, b := range l.Backups {
		for _, v := range b.VMs {
			fmt.Fprintf(w, "%s\t%s/%s\t%s\n", b.Name, v.Namespace, v.Name, v.Checkpoint)
		}
	}
	if err := w.Flush(); err != nil {
		return err
	}
	w = tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
	fmt.Fprintln(w, "\nVM\tCHECKPOINT\tTYPE\tPARENT\tSTATE\tSIZE\tREFERENCED BY")
	for _, c := range l.Checkpoints {
		fmt.Fprintf(w, "%s/%s\t%s\t%s\t%s\t%s\t%s\t%s\n", c.Namespace, c.VM, c.ID, c.Type, dash(c.Parent), c.State,
			size(c.Bytes), dash(strings.Join(c.ReferencedBy, ",")))
	}
	return w.Flush()
}

func dash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

// size is a byte count for people: "1.4 MiB".
func size(n int64) string {
	if n < 0 {
		return fmt.Sprintf("%d B", n)
	}
	return humanize.IBytes(uint64(n))
}

func restoreCommand(st *storage) *cobra.Command {
	var (
		name, disk, target, workDir string
		skipVerify                  bool
	)
	cmd := &cobra.Command{
		Use:   "restore --vm VM --target PATH",
		Short: "Rebuild one disk of a VM from a backup onto a raw file or block device",
		Args:  cobra.NoArgs,
	}
	vm := vmFlags(cmd.Flags())
	cmd.Flags().StringVar(&name, "backup", "", "backup to restore (default: the VM's latest checkpoint)")
	cmd.Flags().StringVar(&disk, "disk", "vda", "disk to restore")
	cmd.Flags().StringVar(&target, "target", "", "raw file (created) or block device (overwritten) to restore onto")
	cmd.Flags().StringVar(&workDir, "work-dir", "", "directory for the downloaded chain when it is restored through staged copies (needs room for all its layers)")
	cmd.Flags().BoolVar(&skipVerify, "skip-verify", false, "do not compare the target with the rebuilt chain after a staged restore")
	out := outputFlag(cmd.Flags())
	_ = cmd.MarkFlagRequired("vm")
	_ = cmd.MarkFlagRequired("target")
	cmd.RunE = func(cmd *cobra.Command, _ []string) error {
		ctx := cmd.Context()
		repo, err := st.repository(ctx)
		if err != nil {
			return err
		}
		p := newProgress(cmd.ErrOrStderr(), "download")
		res, err := repo.Restore(ctx, backup.RestoreOptions{
			Backup: name, VM: *vm, Disk: disk, Target: target, WorkDir: workDir,
			Progress: p.report, SkipVerify: skipVerify,
		})
		if err != nil {
			return err
		}
		r := restored{Namespace: vm.Namespace, VM: vm.Name, Disk: disk, Target: target, Chain: res.Chain, BytesDownloaded: res.Bytes}
		return out.print(cmd.OutOrStdout(), r, func() error {
			_, err := fmt.Fprintf(cmd.OutOrStdout(), "restored %s/%s disk %s onto %s from %s (%s downloaded)\n",
				r.Namespace, r.VM, r.Disk, r.Target, strings.Join(r.Chain, " <- "), size(r.BytesDownloaded))
			return err
		})
	}
	return cmd
}

// restored is what restore prints.
type restored struct {
	Namespace       string   `json:"namespace"`
	VM              string   `json:"vm"`
	Disk            string   `json:"disk"`
	Target          string   `json:"target"`
	Chain           []string `json:"chain"`
	BytesDownloaded int64    `json:"bytesDownloaded"`
}

// report is what delete and gc print as JSON or YAML.
type report struct {
	DryRun      bool     `json:"dryRun"`
	Checkpoints []string `json:"checkpoints"`
	Objects     []string `json:"objects"`
}

func newReport(rep *backup.GCReport, dryRun bool) *report {
	r := &report{DryRun: dryRun, Checkpoints: rep.Checkpoints, Objects: rep.Objects}
	if r.Checkpoints == nil {
		r.Checkpoints = []string{}
	}
	if r.Objects == nil {
		r.Objects = []string{}
	}
	return r
}

// table prints "<done>: N checkpoints, M objects removed", or on a dry run
// "dry run: <would> N checkpoints, M objects", then what they are.
func (r *report) table(w io.Writer, done, would string) error {
	if r.DryRun {
		fmt.Fprintf(w, "dry run: %s %d checkpoints, %d objects\n", would, len(r.Checkpoints), len(r.Objects))
	} else {
		fmt.Fprintf(w, "%s: %d checkpoints, %d objects removed\n", done, len(r.Checkpoints), len(r.Objects))
	}
	for _, c := range r.Checkpoints {
		fmt.Fprintln(w, "  checkpoint", c)
	}
	for _, o := range r.Objects {
		fmt.Fprintln(w, "  object", o)
	}
	return nil
}

func deleteCommand(st *storage) *cobra.Command {
	var (
		name   string
		grace  time.Duration
		dryRun bool
	)
	cmd := &cobra.Command{
		Use:   "delete --backup NAME",
		Short: "Delete a backup and whatever no other backup needs",
		Args:  cobra.NoArgs,
	}
	cmd.Flags().StringVar(&name, "backup", "", "backup to delete")
	cmd.Flags().DurationVar(&grace, "grace", backup.DefaultGrace, "age below which pending uploads and unnamed objects are kept")
	cmd.Flags().BoolVar(&dryRun, "dry-run", false, "only report what would be removed")
	out := outputFlag(cmd.Flags())
	_ = cmd.MarkFlagRequired("backup")
	cmd.RunE = func(cmd *cobra.Command, _ []string) error {
		ctx := cmd.Context()
		repo, err := st.repository(ctx)
		if err != nil {
			return err
		}
		rep, err := repo.DeleteBackup(ctx, name, backup.GCOptions{Grace: grace, DryRun: dryRun})
		if err != nil {
			return err
		}
		r := newReport(rep, dryRun)
		return out.print(cmd.OutOrStdout(), r, func() error {
			return r.table(cmd.OutOrStdout(), "deleted backup "+name, "deleting backup "+name+" would remove")
		})
	}
	return cmd
}

func gcCommand(st *storage) *cobra.Command {
	var (
		grace  time.Duration
		dryRun bool
	)
	cmd := &cobra.Command{
		Use:   "gc",
		Short: "Remove crashed uploads and unreferenced objects",
		Args:  cobra.NoArgs,
	}
	cmd.Flags().DurationVar(&grace, "grace", backup.DefaultGrace, "age below which pending uploads and unnamed objects are kept (negative: none)")
	cmd.Flags().BoolVar(&dryRun, "dry-run", false, "only report what would be removed")
	out := outputFlag(cmd.Flags())
	cmd.RunE = func(cmd *cobra.Command, _ []string) error {
		ctx := cmd.Context()
		repo, err := st.repository(ctx)
		if err != nil {
			return err
		}
		rep, err := repo.Collect(ctx, backup.GCOptions{Grace: grace, DryRun: dryRun})
		if err != nil {
			return err
		}
		r := newReport(rep, dryRun)
		return out.print(cmd.OutOrStdout(), r, func() error {
			return r.table(cmd.OutOrStdout(), "garbage collected", "garbage collection would remove")
		})
	}
	return cmd
}

// progress prints one line per object about once a second.
type progress struct {
	mu   sync.Mutex
	w    io.Writer
	verb string
	last time.Time
}

func newProgress(w io.Writer, verb string) *progress { return &progress{w: w, verb: verb} }

func (p *progress) report(object string, done, total int64) {
	p.mu.Lock()
	defer p.mu.Unlock()
	now := time.Now()
	if done < total && now.Sub(p.last) < time.Second {
		return
	}
	p.last = now
	pct := 100.0
	if total > 0 {
		pct = float64(done) * 100 / float64(total)
	}
	fmt.Fprintf(p.w, "%s %s: %5.1f%% (%s of %s)\n", p.verb, object, pct, size(done), size(total))
}

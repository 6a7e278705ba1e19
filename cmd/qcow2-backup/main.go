// Command qcow2-backup backs up the qcow2 disks of a running libvirt domain
// into an S3 bucket — full, then incremental from libvirt checkpoints — and
// lists, restores and deletes those backups, in the object layout the
// KubeVirt datamover uses, without Velero.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"sort"
	"strings"
	"sync"
	"syscall"
	"text/tabwriter"
	"time"

	"github.com/kubevirt-qcow2/kubevirt-qcow2/pkg/backup"
	"github.com/kubevirt-qcow2/kubevirt-qcow2/pkg/backup/catalog"
	"github.com/kubevirt-qcow2/kubevirt-qcow2/pkg/backup/domain"
	"github.com/kubevirt-qcow2/kubevirt-qcow2/pkg/backup/objectstore"
)

const usage = `usage: qcow2-backup <command> [flags]

commands:
  backup   back up a running libvirt domain's qcow2 disks
  list     list backups and each VM's checkpoints
  restore  rebuild one disk of a VM from a backup onto a raw file or block device
  delete   delete a backup and whatever no other backup needs
  gc       remove crashed uploads and unreferenced objects

Every command takes the storage flags (see "qcow2-backup <command> -h").
`

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := run(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	if err != nil {
		fmt.Fprintln(os.Stderr, "qcow2-backup:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	if len(args) == 0 {
		fmt.Fprint(stderr, usage)
		return errors.New("no command")
	}
	cmd, args := args[0], args[1:]
	fs := flag.NewFlagSet(cmd, flag.ContinueOnError)
	fs.SetOutput(stderr)
	st := storageFlags(fs)
	switch cmd {
	case "backup":
		return runBackup(ctx, fs, st, args, stdout, stderr)
	case "list":
		return runList(ctx, fs, st, args, stdout)
	case "restore":
		return runRestore(ctx, fs, st, args, stdout, stderr)
	case "delete":
		return runDelete(ctx, fs, st, args, stdout)
	case "gc":
		return runGC(ctx, fs, st, args, stdout)
	case "-h", "--help", "help":
		fmt.Fprint(stdout, usage)
		return nil
	}
	fmt.Fprint(stderr, usage)
	return fmt.Errorf("unknown command %q", cmd)
}

type storage struct {
	bsl, credentials string
	cfg              objectstore.Config
}

func storageFlags(fs *flag.FlagSet) *storage {
	s := &storage{}
	fs.StringVar(&s.bsl, "bsl", "", "Velero BackupStorageLocation manifest (YAML) to read the bucket settings from")
	fs.StringVar(&s.credentials, "credentials", "", "credentials file in AWS profile format (the BSL secret's content)")
	fs.StringVar(&s.cfg.Profile, "profile", "", "profile of the credentials file (default \"default\")")
	fs.StringVar(&s.cfg.Bucket, "bucket", "", "bucket (overrides the BSL)")
	fs.StringVar(&s.cfg.Prefix, "prefix", "", "prefix in the bucket (overrides the BSL)")
	fs.StringVar(&s.cfg.Region, "region", "", "region (overrides the BSL)")
	fs.StringVar(&s.cfg.S3URL, "s3-url", "", "S3 endpoint, http(s)://host:port (overrides the BSL)")
	fs.BoolVar(&s.cfg.S3ForcePathStyle, "s3-force-path-style", false, "path-style bucket addressing")
	return s
}

func (s *storage) repository(fs *flag.FlagSet) (*backup.Repository, error) {
	cfg := s.cfg
	if s.bsl != "" {
		var err error
		if cfg, err = objectstore.LoadBSL(s.bsl, s.credentials); err != nil {
			return nil, err
		}
		// Explicit flags win over the manifest.
		fs.Visit(func(f *flag.Flag) {
			switch f.Name {
			case "bucket":
				cfg.Bucket = s.cfg.Bucket
			case "prefix":
				cfg.Prefix = s.cfg.Prefix
			case "region":
				cfg.Region = s.cfg.Region
			case "s3-url":
				cfg.S3URL = s.cfg.S3URL
			case "s3-force-path-style":
				cfg.S3ForcePathStyle = s.cfg.S3ForcePathStyle
			case "profile":
				cfg.Profile = s.cfg.Profile
			}
		})
	}
	cfg.CredentialsFile = s.credentials
	return backup.Open(cfg)
}

func vmFlags(fs *flag.FlagSet) *catalog.VM {
	vm := &catalog.VM{}
	fs.StringVar(&vm.Namespace, "namespace", "default", "namespace the VM's backups are filed under")
	fs.StringVar(&vm.Name, "vm", "", "VM name the backups are filed under")
	return vm
}

func parse(fs *flag.FlagSet, args []string, required ...string) error {
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("unexpected argument %q", fs.Arg(0))
	}
	for _, name := range required {
		if fs.Lookup(name).Value.String() == "" {
			return fmt.Errorf("-%s is required", name)
		}
	}
	return nil
}

func runBackup(ctx context.Context, fs *flag.FlagSet, st *storage, args []string, stdout, stderr io.Writer) error {
	vm := vmFlags(fs)
	uri := fs.String("uri", os.Getenv("LIBVIRT_DEFAULT_URI"), "libvirt connection URI")
	dom := fs.String("domain", "", "libvirt domain to back up")
	name := fs.String("backup", "", "backup name")
	disks := fs.String("disks", "", "comma-separated disk targets (default: every qcow2 disk)")
	forceFull := fs.Bool("force-full", false, "take a full backup whatever the store holds")
	maxChain := fs.Int("max-chain", 0, "maximum layers of a chain; a longer one starts over with a full backup (0: no limit)")
	verify := fs.Bool("verify-content", false, "read back the whole parent chain and check its digests before an incremental")
	workDir := fs.String("work-dir", "", "directory for libvirt's backup files until they are uploaded")
	if err := parse(fs, args, "domain", "backup"); err != nil {
		return err
	}
	if vm.Name == "" {
		vm.Name = *dom
	}
	repo, err := st.repository(fs)
	if err != nil {
		return err
	}
	d, err := domain.Open(*uri, *dom)
	if err != nil {
		return err
	}
	defer d.Close()
	if *disks != "" {
		d.Disks = strings.Split(*disks, ",")
	}
	p := newProgress(stderr, "upload")
	res, err := repo.BackupVM(ctx, *vm, d, backup.BackupOptions{
		Backup: *name, WorkDir: *workDir, Progress: p.report,
		Plan: backup.PlanOptions{ForceFull: *forceFull, MaxChainLength: *maxChain, VerifyContent: *verify},
	})
	if err != nil {
		return err
	}
	c := res.Checkpoint
	fmt.Fprintf(stdout, "backup %s of %s: %s checkpoint %s", *name, vm, c.Type, c.ID)
	if c.Parent != "" {
		fmt.Fprintf(stdout, " (parent %s)", c.Parent)
	}
	fmt.Fprintf(stdout, ", %d bytes uploaded\n", res.Uploaded)
	if res.Plan.Reason != "" {
		fmt.Fprintf(stdout, "full because: %s\n", res.Plan.Reason)
	}
	return nil
}

func runList(ctx context.Context, fs *flag.FlagSet, st *storage, args []string, stdout io.Writer) error {
	vm := vmFlags(fs)
	if err := parse(fs, args); err != nil {
		return err
	}
	repo, err := st.repository(fs)
	if err != nil {
		return err
	}
	backups, err := repo.Backups(ctx)
	if err != nil {
		return err
	}
	w := tabwriter.NewWriter(stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(w, "BACKUP\tVM\tCHECKPOINT")
	for _, b := range backups {
		for _, v := range b.VMs {
			fmt.Fprintf(w, "%s\t%s/%s\t%s\n", b.BackupName, v.Namespace, v.Name, v.CheckpointID)
		}
	}
	if err := w.Flush(); err != nil {
		return err
	}
	vms := []catalog.VM{*vm}
	if vm.Name == "" {
		if vms, err = repo.VMs(ctx); err != nil {
			return err
		}
	}
	w = tabwriter.NewWriter(stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(w, "\nVM\tCHECKPOINT\tTYPE\tPARENT\tSTATE\tBYTES\tREFERENCED BY")
	for _, v := range vms {
		idx, err := repo.Index(ctx, v)
		if err != nil {
			return err
		}
		sort.SliceStable(idx.Checkpoints, func(i, j int) bool { return idx.Checkpoints[i].Timestamp.Before(idx.Checkpoints[j].Timestamp) })
		for _, c := range idx.Checkpoints {
			var size int64
			for _, f := range c.Files {
				size += f.Size
			}
			state := string(c.State)
			if state == "" {
				state = string(catalog.Complete)
			}
			fmt.Fprintf(w, "%s\t%s\t%s\t%s\t%s\t%d\t%s\n", v, c.ID, c.Type, dash(c.Parent), state, size, dash(strings.Join(c.ReferencedBy, ",")))
		}
	}
	return w.Flush()
}

func dash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

func runRestore(ctx context.Context, fs *flag.FlagSet, st *storage, args []string, stdout, stderr io.Writer) error {
	vm := vmFlags(fs)
	name := fs.String("backup", "", "backup to restore (default: the VM's latest checkpoint)")
	disk := fs.String("disk", "vda", "disk to restore")
	target := fs.String("target", "", "raw file (created) or block device (overwritten) to restore onto")
	workDir := fs.String("work-dir", "", "directory for the downloaded chain (needs room for all its layers)")
	skipVerify := fs.Bool("skip-verify", false, "do not compare the target with the rebuilt chain")
	if err := parse(fs, args, "vm", "target"); err != nil {
		return err
	}
	repo, err := st.repository(fs)
	if err != nil {
		return err
	}
	p := newProgress(stderr, "download")
	res, err := repo.Restore(ctx, backup.RestoreOptions{
		Backup: *name, VM: *vm, Disk: *disk, Target: *target, WorkDir: *workDir,
		Progress: p.report, SkipVerify: *skipVerify,
	})
	if err != nil {
		return err
	}
	fmt.Fprintf(stdout, "restored %s disk %s onto %s from %s (%d bytes downloaded)\n",
		vm, *disk, *target, strings.Join(res.Chain, " <- "), res.Bytes)
	return nil
}

func runDelete(ctx context.Context, fs *flag.FlagSet, st *storage, args []string, stdout io.Writer) error {
	name := fs.String("backup", "", "backup to delete")
	grace := fs.Duration("grace", backup.DefaultGrace, "age below which pending uploads and unnamed objects are kept")
	if err := parse(fs, args, "backup"); err != nil {
		return err
	}
	repo, err := st.repository(fs)
	if err != nil {
		return err
	}
	rep, err := repo.DeleteBackup(ctx, *name, backup.GCOptions{Grace: *grace})
	if err != nil {
		return err
	}
	printReport(stdout, "deleted backup "+*name, rep)
	return nil
}

func runGC(ctx context.Context, fs *flag.FlagSet, st *storage, args []string, stdout io.Writer) error {
	grace := fs.Duration("grace", backup.DefaultGrace, "age below which pending uploads and unnamed objects are kept (negative: none)")
	if err := parse(fs, args); err != nil {
		return err
	}
	repo, err := st.repository(fs)
	if err != nil {
		return err
	}
	rep, err := repo.Collect(ctx, backup.GCOptions{Grace: *grace})
	if err != nil {
		return err
	}
	printReport(stdout, "garbage collected", rep)
	return nil
}

func printReport(w io.Writer, what string, rep *backup.GCReport) {
	fmt.Fprintf(w, "%s: %d checkpoints, %d objects removed\n", what, len(rep.Checkpoints), len(rep.Objects))
	for _, c := range rep.Checkpoints {
		fmt.Fprintln(w, "  checkpoint", c)
	}
	for _, o := range rep.Objects {
		fmt.Fprintln(w, "  object", o)
	}
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
	fmt.Fprintf(p.w, "%s %s: %5.1f%% (%d/%d MiB)\n", p.verb, object, pct, done>>20, total>>20)
}

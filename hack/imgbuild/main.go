// Command imgbuild packs files into a single-layer linux/amd64 container
// image FROM scratch and writes it as a docker-archive tarball, which
// `ctr -n k8s.io images import` loads into a node's containerd. It is how
// hack/knode builds Catena's image (and the pause and CoreDNS images of the
// local node) where there is no Docker engine and no registry; the
// Dockerfile stays the way to build the image with Docker.
//
//	imgbuild -o out.tar -t catena:dev -f bin/catena:/usr/local/bin/catena \
//	  -f bin/catenactl:/usr/local/bin/catenactl -d /tmp -user 65532:65532 \
//	  -entrypoint /usr/local/bin/catena
//
// The layer is reproducible: every entry has the Unix epoch as its time,
// so the same inputs give the same image digest.
package main

import (
	"archive/tar"
	"bytes"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"path"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
)

// listFlag is a repeatable string flag.
type listFlag []string

func (l *listFlag) String() string     { return strings.Join(*l, ",") }
func (l *listFlag) Set(s string) error { *l = append(*l, s); return nil }

// spec is what one image is made of.
type spec struct {
	out        string
	tags       []string
	files      []string // SRC:DST[:octal mode]
	dirs       []string
	entrypoint []string
	cmd        []string
	env        []string
	user       string
	labels     []string // K=V
}

func main() {
	var s spec
	var tags, files, dirs, entrypoint, cmd, env, labels listFlag
	flag.StringVar(&s.out, "o", "image.tar", "output docker-archive tarball")
	flag.Var(&tags, "t", "image reference, e.g. catena:dev (repeatable, at least one)")
	flag.Var(&files, "f", "SRC:DST[:octal mode] file to add (repeatable; mode 0755 when omitted)")
	flag.Var(&dirs, "d", "directory to create (repeatable; /tmp gets mode 1777)")
	flag.Var(&entrypoint, "entrypoint", "entrypoint element (repeatable)")
	flag.Var(&cmd, "cmd", "cmd element (repeatable)")
	flag.Var(&env, "env", "K=V environment variable (repeatable)")
	flag.Var(&labels, "label", "K=V image label (repeatable)")
	flag.StringVar(&s.user, "user", "", "user the image runs as, e.g. 65532:65532")
	flag.Parse()
	s.tags, s.files, s.dirs, s.entrypoint, s.cmd, s.env, s.labels = tags, files, dirs, entrypoint, cmd, env, labels
	digest, err := build(s)
	if err != nil {
		fmt.Fprintf(os.Stderr, "imgbuild: %v\n", err)
		os.Exit(1)
	}
	fmt.Printf("wrote %s: %s %s\n", s.out, strings.Join(s.tags, " "), digest)
}

// epoch is the time of every layer entry and of the image, for
// reproducible digests.
var epoch = time.Unix(0, 0).UTC()

func build(s spec) (v1.Hash, error) {
	if len(s.tags) == 0 {
		return v1.Hash{}, errors.New("no -t: an image needs at least one reference")
	}
	layerBytes, err := layerTar(s.files, s.dirs)
	if err != nil {
		return v1.Hash{}, err
	}
	layer, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) {
		return io.NopCloser(bytes.NewReader(layerBytes)), nil
	})
	if err != nil {
		return v1.Hash{}, fmt.Errorf("failed to make the layer: %w", err)
	}
	img, err := mutate.AppendLayers(empty.Image, layer)
	if err != nil {
		return v1.Hash{}, fmt.Errorf("failed to append the layer: %w", err)
	}
	cf, err := img.ConfigFile()
	if err != nil {
		return v1.Hash{}, fmt.Errorf("failed to read the image config: %w", err)
	}
	cf = cf.DeepCopy()
	cf.Architecture = "amd64"
	cf.OS = "linux"
	cf.Created = v1.Time{Time: epoch}
	cf.Config.Entrypoint = s.entrypoint
	cf.Config.Cmd = s.cmd
	cf.Config.User = s.user
	cf.Config.Env = append([]string{"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"}, s.env...)
	for _, l := range s.labels {
		k, v, ok := strings.Cut(l, "=")
		if !ok {
			return v1.Hash{}, fmt.Errorf("label %q is not K=V", l)
		}
		if cf.Config.Labels == nil {
			cf.Config.Labels = map[string]string{}
		}
		cf.Config.Labels[k] = v
	}
	if img, err = mutate.ConfigFile(img, cf); err != nil {
		return v1.Hash{}, fmt.Errorf("failed to set the image config: %w", err)
	}
	refs := map[name.Reference]v1.Image{}
	for _, t := range s.tags {
		r, err := name.ParseReference(t)
		if err != nil {
			return v1.Hash{}, fmt.Errorf("bad image reference %q: %w", t, err)
		}
		refs[r] = img
	}
	tmp := s.out + ".tmp"
	if err := tarball.MultiRefWriteToFile(tmp, refs); err != nil {
		return v1.Hash{}, fmt.Errorf("failed to write %s: %w", s.out, err)
	}
	if err := os.Rename(tmp, s.out); err != nil {
		return v1.Hash{}, fmt.Errorf("failed to rename %s into place: %w", tmp, err)
	}
	return img.Digest()
}

// layerTar writes the layer: directories first (parents before children),
// then the files.
func layerTar(files, dirs []string) ([]byte, error) {
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	seen := map[string]bool{}
	addDir := func(d string) error {
		if d == "/" || d == "." || seen[d] {
			return nil
		}
		seen[d] = true
		mode := int64(0o755)
		if d == "/tmp" {
			mode = 0o1777
		}
		return tw.WriteHeader(&tar.Header{Typeflag: tar.TypeDir, Name: strings.TrimPrefix(d, "/") + "/", Mode: mode, ModTime: epoch})
	}
	addParents := func(p string) error {
		var parents []string
		for d := path.Dir(p); d != "/" && d != "."; d = path.Dir(d) {
			parents = append(parents, d)
		}
		sort.Strings(parents)
		for _, d := range parents {
			if err := addDir(d); err != nil {
				return err
			}
		}
		return nil
	}
	for _, d := range dirs {
		d = path.Clean("/" + d)
		if err := addParents(d); err != nil {
			return nil, err
		}
		if err := addDir(d); err != nil {
			return nil, err
		}
	}
	for _, f := range files {
		parts := strings.Split(f, ":")
		if len(parts) < 2 || len(parts) > 3 {
			return nil, fmt.Errorf("file %q is not SRC:DST[:mode]", f)
		}
		src, dst := parts[0], path.Clean("/"+parts[1])
		mode := int64(0o755)
		if len(parts) == 3 {
			m, err := strconv.ParseInt(parts[2], 8, 64)
			if err != nil {
				return nil, fmt.Errorf("file %q: bad octal mode: %w", f, err)
			}
			mode = m
		}
		data, err := os.ReadFile(src)
		if err != nil {
			return nil, fmt.Errorf("failed to read %s: %w", src, err)
		}
		if err := addParents(dst); err != nil {
			return nil, err
		}
		if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeReg, Name: strings.TrimPrefix(dst, "/"), Mode: mode, Size: int64(len(data)), ModTime: epoch}); err != nil {
			return nil, err
		}
		if _, err := tw.Write(data); err != nil {
			return nil, err
		}
	}
	if err := tw.Close(); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}

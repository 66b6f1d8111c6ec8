package embedded

import (
	"context"
	"fmt"
	"slices"
	"time"

	"github.com/ciproxy/ciproxy/internal/store"
)

// cloned is a copy of c that shares no bytes with it (Handle is its one reference), so that the
// records the store holds and the containers its callers hold never alias.
func cloned(c store.Container) store.Container {
	c.Handle = slices.Clone(c.Handle)
	return c
}

func (s *Store) loadContainers() error {
	ids, err := s.records(dirContainers)
	if err != nil {
		return err
	}
	for _, id := range ids {
		var r store.Container
		if err := s.readRecord(dirContainers, id, &r); err != nil {
			s.quarantine(dirContainers, id+".json", err)
			continue
		}
		if r.ID != id || !store.ContainerKind.Valid(id) {
			s.quarantine(dirContainers, id+".json", fmt.Errorf("record names id %q", r.ID))
			continue
		}
		s.indexContainerLocked(&r)
	}
	return nil
}

// loadContainerFiles reads the container files, removing those whose container is gone (a crash
// while a container was being deleted).
func (s *Store) loadContainerFiles() error {
	ids, err := s.records(dirCFiles)
	if err != nil {
		return err
	}
	for _, id := range ids {
		var r store.ContainerFile
		if err := s.readRecord(dirCFiles, id, &r); err != nil {
			s.quarantine(dirCFiles, id+".json", err)
			continue
		}
		if c, ok := s.containers[r.ContainerID]; !ok || c.Owner != r.Owner || r.ID != id || !store.ContainerFileKind.Valid(id) {
			if err := s.removeRecord(dirCFiles, id, cached); err != nil {
				return err
			}
			continue
		}
		s.indexCFileLocked(&r)
	}
	return nil
}

func (s *Store) indexContainerLocked(r *store.Container) {
	s.ids.Observe(store.ContainerKind, r.ID)
	s.containers[r.ID] = r
	ix := s.ownerCntrs[r.Owner]
	if ix == nil {
		ix = &index{}
		s.ownerCntrs[r.Owner] = ix
	}
	ix.add(r.ID)
	s.placeLocked(r)
}

func (s *Store) indexCFileLocked(r *store.ContainerFile) {
	s.ids.Observe(store.ContainerFileKind, r.ID)
	s.cfiles[r.ID] = r
	ix := s.cntrFiles[r.ContainerID]
	if ix == nil {
		ix = &index{}
		s.cntrFiles[r.ContainerID] = ix
	}
	ix.add(r.ID)
}

// dropContainerLocked removes a container: its record first (its files are then orphans, which
// Open removes should a crash come next), then its files.
func (s *Store) dropContainerLocked(id string) error {
	r, ok := s.containers[id]
	if !ok {
		return nil
	}
	if err := s.removeRecord(dirContainers, id, synced); err != nil {
		return err
	}
	delete(s.containers, id)
	s.unplaceLocked(r.Owner, id)
	if ix := s.ownerCntrs[r.Owner]; ix != nil {
		if ix.remove(id); len(*ix) == 0 {
			delete(s.ownerCntrs, r.Owner)
		}
	}
	var firstErr error
	if ix := s.cntrFiles[id]; ix != nil {
		for _, fid := range *ix {
			delete(s.cfiles, fid)
			if err := s.removeRecord(dirCFiles, fid, cached); err != nil && firstErr == nil {
				firstErr = err
			}
		}
		delete(s.cntrFiles, id)
	}
	return firstErr
}

// liveContainerLocked returns owner's container id unless it is forgotten.
func (s *Store) liveContainerLocked(owner, id string) (*store.Container, error) {
	if err := s.checkOpen(); err != nil {
		return nil, err
	}
	r, ok := s.containers[id]
	if !ok || r.Owner != owner || expired(r.ForgetAt, s.now()) {
		return nil, fmt.Errorf("container %s: %w", id, store.ErrNotFound)
	}
	return r, nil
}

// CreateContainer implements [store.Containers.CreateContainer].
func (s *Store) CreateContainer(_ context.Context, c store.Container) (store.Container, error) {
	if c.ID != "" && !store.ContainerKind.Valid(c.ID) {
		return store.Container{}, fmt.Errorf("%w: %q is not a container id", errInvalid, c.ID)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.checkOpen(); err != nil {
		return store.Container{}, err
	}
	if c.ID == "" {
		c.ID = s.ids.New(store.ContainerKind)
	}
	if old, taken := s.containers[c.ID]; taken {
		if !expired(old.ForgetAt, s.now()) {
			return store.Container{}, fmt.Errorf("container %s: %w", c.ID, store.ErrExists)
		}
		if err := s.dropContainerLocked(c.ID); err != nil {
			return store.Container{}, err
		}
	}
	if c.CreatedAt.IsZero() {
		c.CreatedAt = s.now()
	}
	c.Version = 1
	r := cloned(c)
	if err := s.writeRecord(dirContainers, c.ID, &r, synced, time.Time{}); err != nil {
		return store.Container{}, err
	}
	s.indexContainerLocked(&r)
	return cloned(r), nil
}

// Container implements [store.Containers.Container].
func (s *Store) Container(_ context.Context, owner, id string) (store.Container, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	r, err := s.liveContainerLocked(owner, id)
	if err != nil {
		return store.Container{}, err
	}
	return cloned(*r), nil
}

// UpdateContainer implements [store.Containers.UpdateContainer]. The record is written without
// fsync: updates are frequent (every use moves last_active_at), and losing the last one to a
// power cut costs a container some idle time at most.
func (s *Store) UpdateContainer(_ context.Context, c store.Container) (store.Container, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	old, err := s.liveContainerLocked(c.Owner, c.ID)
	if err != nil {
		return store.Container{}, err
	}
	if old.Version != c.Version {
		return store.Container{}, fmt.Errorf("container %s: version %d, not %d: %w", c.ID, old.Version, c.Version, store.ErrConflict)
	}
	c.CreatedAt = old.CreatedAt
	c.Version++
	r := cloned(c)
	if err := s.writeRecord(dirContainers, c.ID, &r, cached, time.Time{}); err != nil {
		return store.Container{}, err
	}
	s.containers[c.ID] = &r
	s.placeLocked(&r)
	return cloned(r), nil
}

// DeleteContainer implements [store.Containers.DeleteContainer].
func (s *Store) DeleteContainer(_ context.Context, owner, id string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, err := s.liveContainerLocked(owner, id); err != nil {
		return err
	}
	return s.dropContainerLocked(id)
}

// ListContainers implements [store.Containers.ListContainers].
func (s *Store) ListContainers(_ context.Context, owner string, q store.ContainerQuery) (store.List[store.Container], error) {
	if q.After != "" && !store.ContainerKind.Valid(q.After) {
		return store.List[store.Container]{}, fmt.Errorf("%w: after %q is not a container id", errInvalid, q.After)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.checkOpen(); err != nil {
		return store.List[store.Container]{}, err
	}
	ix := s.ownerCntrs[owner]
	if ix == nil {
		return store.List[store.Container]{}, nil
	}
	now := s.now()
	return page(*ix, q.Page, func(id string) (store.Container, bool) {
		r := s.containers[id]
		if expired(r.ForgetAt, now) || (q.Name != "" && r.Name != q.Name) {
			return store.Container{}, false
		}
		return cloned(*r), true
	}), nil
}

// ExpiringContainers implements [store.Containers.ExpiringContainers].
func (s *Store) ExpiringContainers(_ context.Context, before time.Time, limit int) ([]store.Container, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.checkOpen(); err != nil {
		return nil, err
	}
	now := s.now()
	var due []*store.Container
	for _, r := range s.containers {
		if !r.ExpiresAt.IsZero() && !r.ExpiresAt.After(before) && !expired(r.ForgetAt, now) {
			due = append(due, r)
		}
	}
	slices.SortFunc(due, func(a, b *store.Container) int {
		if c := a.ExpiresAt.Compare(b.ExpiresAt); c != 0 {
			return c
		}
		return compareStrings(a.ID, b.ID)
	})
	if limit > 0 && len(due) > limit {
		due = due[:limit]
	}
	out := make([]store.Container, len(due))
	for i, r := range due {
		out[i] = cloned(*r)
	}
	return out, nil
}

func compareStrings(a, b string) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

// PutContainerFile implements [store.ContainerFiles.PutContainerFile].
func (s *Store) PutContainerFile(_ context.Context, f store.ContainerFile) (store.ContainerFile, error) {
	if f.ID != "" && !store.ContainerFileKind.Valid(f.ID) {
		return store.ContainerFile{}, fmt.Errorf("%w: %q is not a container file id", errInvalid, f.ID)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, err := s.liveContainerLocked(f.Owner, f.ContainerID); err != nil {
		return store.ContainerFile{}, err
	}
	if f.ID == "" {
		f.ID = s.ids.New(store.ContainerFileKind)
	} else if old, ok := s.cfiles[f.ID]; ok && (old.ContainerID != f.ContainerID || old.Owner != f.Owner) {
		// An id names one file of one container; another container cannot take it over.
		return store.ContainerFile{}, fmt.Errorf("container file %s: %w", f.ID, store.ErrExists)
	}
	if f.CreatedAt.IsZero() {
		f.CreatedAt = s.now()
	}
	r := &f
	if err := s.writeRecord(dirCFiles, f.ID, r, synced, time.Time{}); err != nil {
		return store.ContainerFile{}, err
	}
	s.indexCFileLocked(r)
	return f, nil
}

func (s *Store) liveCFileLocked(owner, containerID, id string) (*store.ContainerFile, error) {
	if _, err := s.liveContainerLocked(owner, containerID); err != nil {
		return nil, err
	}
	r, ok := s.cfiles[id]
	if !ok || r.ContainerID != containerID {
		return nil, fmt.Errorf("container file %s: %w", id, store.ErrNotFound)
	}
	return r, nil
}

// ContainerFile implements [store.ContainerFiles.ContainerFile].
func (s *Store) ContainerFile(_ context.Context, owner, containerID, id string) (store.ContainerFile, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	r, err := s.liveCFileLocked(owner, containerID, id)
	if err != nil {
		return store.ContainerFile{}, err
	}
	return *r, nil
}

// ListContainerFiles implements [store.ContainerFiles.ListContainerFiles].
func (s *Store) ListContainerFiles(_ context.Context, owner, containerID string, q store.ContainerFileQuery) (store.List[store.ContainerFile], error) {
	if q.After != "" && !store.ContainerFileKind.Valid(q.After) {
		return store.List[store.ContainerFile]{}, fmt.Errorf("%w: after %q is not a container file id", errInvalid, q.After)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, err := s.liveContainerLocked(owner, containerID); err != nil {
		return store.List[store.ContainerFile]{}, err
	}
	ix := s.cntrFiles[containerID]
	if ix == nil {
		return store.List[store.ContainerFile]{}, nil
	}
	return page(*ix, q.Page, func(id string) (store.ContainerFile, bool) {
		r := s.cfiles[id]
		if q.Path != "" && r.Path != q.Path {
			return store.ContainerFile{}, false
		}
		return *r, true
	}), nil
}

// DeleteContainerFile implements [store.ContainerFiles.DeleteContainerFile].
func (s *Store) DeleteContainerFile(_ context.Context, owner, containerID, id string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, err := s.liveCFileLocked(owner, containerID, id); err != nil {
		return err
	}
	if err := s.removeRecord(dirCFiles, id, synced); err != nil {
		return err
	}
	delete(s.cfiles, id)
	if ix := s.cntrFiles[containerID]; ix != nil {
		if ix.remove(id); len(*ix) == 0 {
			delete(s.cntrFiles, containerID)
		}
	}
	return nil
}

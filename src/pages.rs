//! A growable array in fixed pages, for tables of up to millions of entries (the engine's
//! watch slots, the partition task's live watches): growing it never copies more than its
//! first page nor leaves up to half of it allocated but unused, as a doubling `Vec` would.

/// Slots per page: big enough that the page table is negligible, small enough that the
/// unused tail of the last page is (4,096 engine slots of 88 bytes: 352 KiB at most).
pub const PAGE: usize = 4096;

/// A growable array in fixed pages: appending never copies more than the first page or
/// over-allocates more than one page, and an element's index never changes. The first page
/// grows as a `Vec` does, up to [`PAGE`] (a table with a few watches holds a few slots,
/// not 352 KiB: an instance has a table per partition it owns); every later page is
/// allocated whole.
pub struct Pages<T> {
    pages: Vec<Vec<T>>,
    len: usize,
}

impl<T> Default for Pages<T> {
    fn default() -> Self {
        Self {
            pages: Vec::new(),
            len: 0,
        }
    }
}

impl<T> Pages<T> {
    /// Append, returning the new element's index.
    pub fn push(&mut self, value: T) -> u32 {
        let index = self.len;
        if index.is_multiple_of(PAGE) {
            self.pages.push(if index == 0 {
                Vec::new()
            } else {
                Vec::with_capacity(PAGE)
            });
        }
        let page = &mut self.pages[index / PAGE];
        if page.len() == page.capacity() {
            // Only the first page is ever full below PAGE: double it, at most to PAGE.
            let grown = (page.capacity() * 2).clamp(8, PAGE);
            page.reserve_exact(grown - page.len());
        }
        // No page is pushed past PAGE: a full one is followed by a new page.
        page.push(value);
        self.len += 1;
        index as u32
    }

    pub fn get(&self, index: u32) -> Option<&T> {
        let i = index as usize;
        self.pages.get(i / PAGE)?.get(i % PAGE)
    }

    pub fn get_mut(&mut self, index: u32) -> Option<&mut T> {
        let i = index as usize;
        self.pages.get_mut(i / PAGE)?.get_mut(i % PAGE)
    }

    pub fn len(&self) -> usize {
        self.len
    }

    /// Every element, in index order.
    pub fn iter(&self) -> impl Iterator<Item = &T> {
        self.pages.iter().flatten()
    }

    /// Every element, in index order.
    pub fn iter_mut(&mut self) -> impl Iterator<Item = &mut T> {
        self.pages.iter_mut().flatten()
    }

    /// Heap bytes of the pages (their capacity).
    #[cfg(test)]
    pub fn heap_bytes(&self) -> usize {
        self.pages.iter().map(Vec::capacity).sum::<usize>() * std::mem::size_of::<T>()
    }

    /// For indexes the table handed out itself (always in range).
    pub fn at(&self, index: u32) -> &T {
        let i = index as usize;
        &self.pages[i / PAGE][i % PAGE]
    }

    pub fn at_mut(&mut self, index: u32) -> &mut T {
        let i = index as usize;
        &mut self.pages[i / PAGE][i % PAGE]
    }
}

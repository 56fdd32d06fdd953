defmodule Heft.PersistFilesTest do
  # The files Heft writes: never through a planted symbolic link, temporary
  # files under unpredictable names, mode 0600 in a directory only the
  # owner can enter (issue 9, section 7).
  use ExUnit.Case, async: true
  import Bitwise

  @moduletag :tmp_dir

  defp mode(path), do: File.stat!(path).mode &&& 0o777

  defp victim(ctx) do
    v = Path.join(ctx.tmp_dir, "victim")
    File.write!(v, "keep me")
    v
  end

  defp untouched?(v), do: File.read!(v) == "keep me" and mode(v) == 0o644

  setup ctx do
    # The victim's mode is part of what must not change.
    v = victim(ctx)
    File.chmod!(v, 0o644)
    {:ok, victim: v}
  end

  test "tab2file replaces a link planted at the destination, never writes through it", ctx do
    t = Heft.new(:link_dest, [])
    Heft.insert(t, {1, :one})
    dest = Path.join(ctx.tmp_dir, "out.tab")
    File.ln_s!(ctx.victim, dest)

    assert Heft.tab2file(t, dest) == :ok
    assert untouched?(ctx.victim)
    {:ok, %File.Stat{type: :regular}} = File.lstat(dest)
    assert mode(dest) == 0o600
    {:ok, t2} = Heft.file2tab(dest)
    assert Heft.tab2list(t2) == [{1, :one}]
  end

  test "tab2file's temporary file has an unpredictable name: links at the old names stay", ctx do
    t = Heft.new(:link_tmp, [])
    Heft.insert(t, {1, :one})
    dest = Path.join(ctx.tmp_dir, "out.tab")
    # The names tab2file used to write (dest.tmp-N, small N).
    planted = for n <- 0..200, do: "#{dest}.tmp-#{n}"
    for p <- planted, do: File.ln_s!(ctx.victim, p)

    for _ <- 1..5, do: assert(Heft.tab2file(t, dest, sync: true) == :ok)
    assert untouched?(ctx.victim)
    # No temporary file is left, and the planted links are still links.
    leftovers = File.ls!(ctx.tmp_dir) |> Enum.filter(&String.contains?(&1, ".tmp-"))
    assert length(leftovers) == length(planted)
    assert mode(dest) == 0o600
  end

  test "tab2file over a directory fails with :eisdir and leaves no temporary file", ctx do
    t = Heft.new(:tab_dir, [])
    target = Path.join(ctx.tmp_dir, "adir")
    File.mkdir_p!(target)
    assert Heft.tab2file(t, target) == {:error, :eisdir}
    assert File.ls!(ctx.tmp_dir) |> Enum.filter(&String.contains?(&1, ".tmp-")) == []
  end

  test "tab2file output is 0600 whatever the umask allows", ctx do
    t = Heft.new(:tab_mode, [])
    dest = Path.join(ctx.tmp_dir, "plain.tab")
    assert Heft.tab2file(t, dest) == :ok
    assert mode(dest) == 0o600
  end

  test "a table directory open to others (0777) is tightened to 0700", ctx do
    d = Path.join(ctx.tmp_dir, "open")
    File.mkdir_p!(d)
    File.chmod!(d, 0o777)
    t = Heft.new(:loose, persist: d)
    assert mode(d) == 0o700
    Heft.insert(t, {1, 2})
    :ok = Heft.dump(t)
    :ok = Heft.close(t)
    for f <- File.ls!(d), do: assert(mode(Path.join(d, f)) == 0o600, f)
    File.chmod!(d, 0o777)
    {:ok, t} = Heft.open(d)
    assert mode(d) == 0o700
    :ok = Heft.close(t)
  end

  test "links planted at the names of META's, HASHKEY's and the snapshot's temporary files are not followed",
       ctx do
    d = Path.join(ctx.tmp_dir, "t")
    t = Heft.new(:planted, persist: d)
    Heft.insert(t, {1, :one})
    :ok = Heft.close(t)

    for name <- ~w(META.tmp HASHKEY.tmp snapshot.tmp MANIFEST.tmp),
        do: File.ln_s!(ctx.victim, Path.join(d, name))

    File.rm!(Path.join(d, "HASHKEY"))
    # Changed options rewrite META; a missing hash key is rewritten; a
    # dump writes a snapshot.
    {:ok, t} = Heft.open(d, sync: :commit)
    :ok = Heft.dump(t)
    :ok = Heft.close(t)
    assert untouched?(ctx.victim)
    {:ok, t} = Heft.open(d)
    assert Heft.info(t, :sync) == :commit
    assert Heft.lookup(t, 1) == [{1, :one}]
    :ok = Heft.close(t)
    for f <- File.ls!(d), do: assert(mode(Path.join(d, f)) == 0o600, f)
  end

  test "a link planted at a table file is refused, not followed", ctx do
    for name <- ["MANIFEST", "MANIFEST.reserve"] do
      d = Path.join(ctx.tmp_dir, name)
      t = Heft.new(:planted_meta, persist: d)
      :ok = Heft.close(t)
      File.rm!(Path.join(d, name))
      File.ln_s!(ctx.victim, Path.join(d, name))
      assert Heft.open(d) == {:error, :eloop}
      assert untouched?(ctx.victim)
    end
  end
end

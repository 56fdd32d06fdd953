defmodule Heft.TabFile do
  # tab2file/file2tab (documented in lib/heft.ex). The file format -
  # magic, version, then checksummed frames (meta, dictionaries...,
  # objects..., end) - is specified in docs/tab-file.md; this module is its
  # only implementation. Objects are stored as terms (whatever their codec
  # in the table); the table's zstd dictionaries go with them so that the
  # table file2tab makes compresses as the one written did.
  #
  # All file I/O is Erlang raw file I/O, which runs on dirty I/O
  # schedulers; objects move in chunks of a few hundred, so neither side
  # holds the table in memory.
  @moduledoc false

  import Heft.Native, only: [call: 1]
  import Bitwise, only: [<<<: 2]
  alias Heft.Native

  @magic "HEFT-TAB"
  # disk_log's magic, which begins a file ETS's tab2file wrote.
  @ets_magic <<1, 2, 3, 4>>
  # Version 1: no dictionary frames. Version 2 (written only when the
  # table has zstd dictionaries): dictionary frames after the meta frame.
  @version 2
  @tag_meta 0x00
  @tag_objects 0x01
  @tag_dictionary 0x02
  @tag_end 0xFF
  @head_bytes byte_size(@magic) + 2
  @frame_header 17
  @chunk 256

  @type reason ::
          File.posix()
          | :badfile
          | {:unsupported_version, pos_integer}
          | {:truncated, non_neg_integer}
          | {:corrupt, non_neg_integer}
          | :cannot_create_table
          | {:unsupported_object, non_neg_integer}

  ## Writing

  @spec write(reference | atom, Path.t(), keyword) :: :ok | {:error, File.posix()}
  def write(ref, filename, opts) do
    sync = Keyword.get(opts, :sync, false)
    info = Native.info_map(ref)
    _ = Native.select_access(ref, false)
    filename = filename |> IO.chardata_to_string() |> Path.expand()

    # A temporary file next to the destination, created exclusively under
    # a random name (never through a link), mode 0600; renamed over the
    # destination when whole (tab_file.rs).
    with {:ok, io} <- Native.tmp_create(filename, 0o600) do
      case write_all(io, ref, info) do
        :ok ->
          Native.tmp_finish(io, true, sync)

        error ->
          _ = Native.tmp_finish(io, false, false)
          error
      end
    end
  end

  defp write_all(io, ref, info) do
    compress = if info.compression == :none, do: [], else: [compressed: 1]

    meta = %{
      name: info.name,
      named_table: info.named_table,
      type: Map.get(info, :type, :set),
      keypos: info.keypos,
      protection: info.protection,
      compression: Heft.__compression_shape__(info.compression)
    }

    # The dictionaries the table has now: the objects are stored as terms,
    # so any added meanwhile are not needed to read them.
    dictionaries = Native.tab_dictionaries(ref)
    version = if dictionaries == [], do: 1, else: @version

    with :ok <- put(io, [@magic, <<version::little-16>>]),
         :ok <- put(io, frame(@tag_meta, 0, 0, :erlang.term_to_binary(meta))),
         {:ok, seq} <- write_dictionaries(io, dictionaries, 1),
         {:ok, seq, total} <- write_objects(io, ref, :start, seq, 0, compress) do
      put(io, frame(@tag_end, seq, 0, <<total::little-64>>))
    end
  end

  defp put(io, iodata), do: Native.tmp_write(io, IO.iodata_to_binary(iodata))

  defp write_dictionaries(_io, [], seq), do: {:ok, seq}

  defp write_dictionaries(io, [d | rest], seq) do
    with :ok <- put(io, frame(@tag_dictionary, seq, 0, d)),
         do: write_dictionaries(io, rest, seq + 1)
  end

  defp write_objects(_io, _ref, :"$end_of_table", seq, total, _compress), do: {:ok, seq, total}

  defp write_objects(io, ref, cursor, seq, total, compress) do
    size = @chunk

    case call(chunk(ref, cursor, size)) do
      {[], next} ->
        write_objects(io, ref, next, seq, total, compress)

      {objects, next} ->
        n = length(objects)
        payload = :erlang.term_to_binary(objects, compress)

        with :ok <- put(io, frame(@tag_objects, seq, n, payload)) do
          write_objects(io, ref, next, seq + 1, total + n, compress)
        end
    end
  end

  defp frame(tag, seq, count, payload) do
    header = <<tag, seq::little-32, count::little-32, byte_size(payload)::little-32>>

    [
      header,
      <<:erlang.crc32(header)::little-32>>,
      payload,
      <<:erlang.crc32(payload)::little-32>>
    ]
  end

  ## Reading

  # A file ETS's tab2file/2,3 wrote (a disk_log) is read by
  # Heft.EtsTabFile.
  @spec read(Path.t(), keyword) :: {:ok, Heft.tab()} | {:error, reason | term}
  def read(filename, opts) do
    result =
      with {:ok, io} <- :file.open(filename, [:read, :raw, :binary, {:read_ahead, 1 <<< 20}]) do
        try do
          read_all(io, opts)
        after
          :file.close(io)
        end
      end

    case result do
      {:error, :ets_file} -> Heft.EtsTabFile.read(filename, opts)
      result -> result
    end
  end

  defp read_all(io, opts) do
    with {:ok, version} <- read_head(io),
         {:ok, @tag_meta, 0, payload, offset} <- read_frame(io, @head_bytes, 0),
         {:ok, meta} <- decode_meta(payload, @head_bytes),
         {:ok, tab} <- create(meta, opts) do
      # Whatever stops the load, no table is left behind.
      case load(io, tab, meta.keypos, offset, version >= 2) do
        :ok ->
          {:ok, tab}

        error ->
          _ = Heft.delete(tab)
          error
      end
    else
      {:ok, _tag, _count, _payload, _offset} -> {:error, {:corrupt, @head_bytes}}
      error -> error
    end
  end

  ## tabfile_info/1

  @end_frame @frame_header + 8 + 4

  # The head, the meta frame and the end frame (the file's last bytes),
  # each checked; the objects frames between are not read.
  @spec info(Path.t()) :: {:ok, keyword} | {:error, reason | term}
  def info(filename) do
    case heft_info(filename) do
      {:error, :ets_file} -> Heft.EtsTabFile.info(filename)
      result -> result
    end
  end

  defp heft_info(filename) do
    with {:ok, io} <- :file.open(filename, [:read, :raw, :binary]) do
      try do
        with {:ok, version} <- read_head(io),
             {:ok, @tag_meta, 0, payload, offset} <- read_frame(io, @head_bytes, 0),
             {:ok, meta} <- decode_meta(payload, @head_bytes),
             {:ok, size} <- read_end(io, offset) do
          {:ok,
           [
             name: meta.name,
             type: meta.type,
             protection: Map.get(meta, :protection, :protected),
             named_table: meta.named_table,
             keypos: meta.keypos,
             size: size,
             extended_info: [:object_count],
             version: {version, 0}
           ]}
        else
          {:ok, _tag, _count, _payload, _offset} -> {:error, {:corrupt, @head_bytes}}
          error -> error
        end
      after
        :file.close(io)
      end
    end
  end

  # The object count of the end frame, which must be the last @end_frame
  # bytes of the file, after the frames that end at `offset`.
  defp read_end(io, offset) do
    with {:ok, length} <- :file.position(io, :eof) do
      at = length - @end_frame

      with true <- at >= offset,
           {:ok, <<@tag_end, _::binary>> = frame} <- :file.pread(io, at, @end_frame) do
        <<head::binary-13, hcrc::little-32, total::little-64, pcrc::little-32>> = frame
        <<_tag, _seq::little-32, count::little-32, len::little-32>> = head

        cond do
          # Not an end frame's header, only a byte that looks like its
          # tag (one in 256 files cut short): the file ends early.
          :erlang.crc32(head) != hcrc -> {:error, {:truncated, length}}
          count == 0 and len == 8 and :erlang.crc32(<<total::little-64>>) == pcrc -> {:ok, total}
          true -> {:error, {:corrupt, at}}
        end
      else
        {:error, _} = error -> error
        _ -> {:error, {:truncated, length}}
      end
    end
  end

  defp read_head(io) do
    case :file.read(io, @head_bytes) do
      {:ok, <<@magic, v::little-16>>} when v in 1..@version -> {:ok, v}
      {:ok, <<@magic, 0::little-16>>} -> {:error, {:corrupt, byte_size(@magic)}}
      {:ok, <<@magic, v::little-16>>} -> {:error, {:unsupported_version, v}}
      {:ok, <<@magic, _::binary>>} -> {:error, {:truncated, byte_size(@magic)}}
      {:ok, <<@ets_magic::binary, _::binary>>} -> {:error, :ets_file}
      {:ok, _} -> {:error, :badfile}
      :eof -> {:error, :badfile}
      {:error, _} = error -> error
    end
  end

  # {:ok, tag, count, payload, next_offset} for the frame at `offset`,
  # which must carry sequence number `seq`.
  defp read_frame(io, offset, seq) do
    with {:ok, header} <- read_exactly(io, @frame_header, offset) do
      <<head::binary-13, hcrc::little-32>> = header
      <<tag, got_seq::little-32, count::little-32, len::little-32>> = head

      cond do
        :erlang.crc32(head) != hcrc or got_seq != seq ->
          {:error, {:corrupt, offset}}

        true ->
          with {:ok, frame} <- read_exactly(io, len + 4, offset) do
            payload = binary_part(frame, 0, len)
            <<pcrc::little-32>> = binary_part(frame, len, 4)

            if :erlang.crc32(payload) == pcrc,
              do: {:ok, tag, count, payload, offset + @frame_header + len + 4},
              else: {:error, {:corrupt, offset}}
          end
      end
    end
  end

  # `n` bytes, or {:truncated, offset} (the frame's start) if the file
  # ends first.
  defp read_exactly(io, n, offset) do
    case :file.read(io, n) do
      {:ok, bytes} when byte_size(bytes) == n -> {:ok, bytes}
      {:ok, _short} -> {:error, {:truncated, offset}}
      :eof -> {:error, {:truncated, offset}}
      {:error, _} = error -> error
    end
  end

  defp decode_meta(payload, offset) do
    case safe_decode(payload) do
      {:ok, %{name: name, named_table: named, type: type, keypos: keypos} = meta}
      when is_atom(name) and is_boolean(named) and is_atom(type) and is_integer(keypos) and
             keypos >= 1 ->
        {:ok, meta}

      _ ->
        {:error, {:corrupt, offset}}
    end
  end

  defp safe_decode(payload) do
    {:ok, :erlang.binary_to_term(payload)}
  rescue
    ArgumentError -> :error
  end

  defp create(meta, opts) do
    compression =
      case Map.get(meta, :compression, {:zlib, 1}) do
        {:zlib, level} -> [compression: :zlib, compression_level: level]
        {:zstd, zstd} when is_list(zstd) -> [compression: {:zstd, zstd}]
        {:auto, _chosen} -> [compression: :auto]
        c when c in [:none, :lz4, :zstd, :auto] -> [compression: c]
        _ -> []
      end

    options =
      [meta.type, Map.get(meta, :protection, :protected), {:keypos, meta.keypos}] ++
        if(meta.named_table, do: [:named_table], else: []) ++
        compression ++ Keyword.take(opts, [:arena])

    {:ok, Heft.new(meta.name, options)}
  rescue
    ArgumentError -> {:error, :cannot_create_table}
    e in Heft.Error -> {:error, e.reason}
  end

  defp load(io, tab, keypos, offset, dictionaries?) do
    read_objects(io, tab, keypos, offset, 1, 0, dictionaries?)
  rescue
    e ->
      _ = Heft.delete(tab)
      reraise e, __STACKTRACE__
  end

  # `dictionaries?`: a dictionary frame may come here (version 2, before
  # the first objects frame).
  defp read_objects(io, tab, keypos, offset, seq, total, dictionaries?) do
    case read_frame(io, offset, seq) do
      {:ok, @tag_dictionary, 0, payload, next} when dictionaries? ->
        with :ok <- add_dictionary(tab, payload, offset),
             do: read_objects(io, tab, keypos, next, seq + 1, total, true)

      {:ok, @tag_objects, count, payload, next} ->
        with {:ok, objects} <- objects(payload, count, keypos, offset),
             true <- insert(tab, objects, offset) do
          read_objects(io, tab, keypos, next, seq + 1, total + count, false)
        end

      {:ok, @tag_end, 0, <<^total::little-64>>, next} ->
        case :file.read(io, 1) do
          :eof -> :ok
          {:ok, _} -> {:error, {:corrupt, next}}
          {:error, _} = error -> error
        end

      {:ok, _tag, _count, _payload, _next} ->
        {:error, {:corrupt, offset}}

      error ->
        error
    end
  end

  # Bytes zstd refuses as a dictionary (their checksum held: a file not
  # written by Heft) make the frame corrupt.
  defp add_dictionary(tab, bytes, offset) do
    ref = with %Heft.Table{ref: ref} <- tab, do: ref
    Native.tab_add_dictionary(ref, bytes)
  rescue
    ArgumentError -> {:error, {:corrupt, offset}}
  end

  # Objects Heft refuses (maps nested too deep in a key or a bag's
  # object) make the file one this Heft cannot load.
  defp insert(tab, objects, offset) do
    Heft.insert(tab, objects)
  rescue
    ArgumentError -> {:error, {:unsupported_object, offset}}
  end

  defp objects(payload, count, keypos, offset) do
    with {:ok, objects} when is_list(objects) <- safe_decode(payload),
         true <- length(objects) == count,
         true <- Enum.all?(objects, &(is_tuple(&1) and tuple_size(&1) >= keypos)) do
      {:ok, objects}
    else
      _ -> {:error, {:corrupt, offset}}
    end
  end
end

-- Document masking for packed sequences: several documents are concatenated
-- into one sequence; `doc` gives the document id of every position
-- (--buffer doc=doc_ids.npy, int32), and a query only sees earlier keys of
-- its own document.
local doc = buffer("doc", "i32")

return {
  name = "document_causal",
  mask_mod = document(doc),
}
